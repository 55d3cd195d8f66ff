#!/usr/bin/env python3
"""Records llama.cpp's tokenization (through llama-cpp-python) of a fixed set of
strings, the reference engine/tokenizer.c must reproduce exactly.

Writes (under tests/fixtures/):
  ref_tokens.json      default model (SmolLM2, gpt2 BPE, pre "smollm")
  ref_tokens_spm.json  the tiny SentencePiece vocabulary (make_spm_vocab.py)
  ref_tokens_pre.json  the default model's vocabulary and merges re-labelled
                       with other tokenizer.ggml.pre values (gpt2, llama3,
                       qwen2, ...), to pin down each pre-tokenizer

Each file holds, per string, the ids with parse_special off ("plain") and on
("special"), plus special-token ids, end-of-generation ids and a hash of every
token's piece (render_special on and off).

    python tests/reference/record_tokens.py [--model M.gguf] [--spm S.gguf] [--check]

--check regenerates everything in memory and exits 1 when it differs from the
stored files (e.g. after a llama-cpp-python upgrade).
"""
import argparse
import ctypes
import json
import os
import random
import sys
import tempfile

import gguf
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures")

# pre-tokenizer variants recorded against the default model's vocabulary
PRE_VARIANTS = ["default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "falcon", "deepseek-llm",
                "deepseek-coder", "deepseek-v3", "starcoder", "poro-chat", "viking", "tekken",
                "gpt-4o", "seed-coder", "bailingmoe", "chatglm-bpe", "dbrx"]

SPECIAL_SNIPPETS = [
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_end|><|im_end|>",
    "<|im_start|><|im_start|>x",
    "<|im_start",
    "|im_start|>",
    "<|im_start|",
    "<<|im_start|>>",
    "a<|im_end|>b<|im_start|>c",
    " <|im_end|> ",
    "<repo_name>foo<file_sep>bar.py\n<filename>x",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<s>hello</s>",
    "<s> hello </s>",
    "</s></s>",
    "<unk>",
    "<|user|>hi<|user|>",
    "<mask> masked <mask>",
    "[unused0]",
    "<|im_start|>user<|im_end|>",
]

HAND = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "\t",
    "\t\t\tx",
    " \n",
    "\r\n",
    "a\r\nb\r\n\r\nc",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "hello  world",
    "hello   world",
    "hello    world  ",
    "The quick brown fox jumps over the lazy dog.",
    "It's a dog's life, isn't it? We'll see, you'd think, they're here, I've been, I'm done.",
    "IT'S LOUD. WE'LL GO. THEY'RE HERE. I'M OK. SHE'D GO. YOU'VE SEEN.",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "don't won't can't shouldn't",
    "''' \"\"\" '''",
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "1234567890",
    "3.14159265358979",
    "1,000,000 and 2.5e-10",
    " 42 ",
    "0x1F 0b1010 0o777",
    "2023-10-01T12:34:56Z",
    "Call 555-1234 or +1 (800) 555-0199.",
    "Version 1.2.3-beta+exp.sha.5114f85",
    "a1b2c3d4",
    "abc123def456",
    "price: $12.99, €9,50, ¥1000, £5",
    "100% sure; 50/50 odds; 3:1",
    "def foo(bar, baz=None):\n    return bar + baz\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "if x == 1 && y != 2 || z >= 3:",
    "    indented\n        more\n",
    "SELECT * FROM users WHERE id = 42;",
    "<div class=\"x\">Hello &amp; bye</div>",
    "https://example.com/path?query=1&b=two#frag",
    "user@example.com",
    "C:\\Windows\\System32\\drivers\\etc\\hosts",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "x=1;y=2;z=x+y",
    "a+b=c",
    "...",
    "!!!???",
    "-- -- --",
    "(parenthesized) [bracketed] {braced}",
    "\"quoted\" 'single' `backtick`",
    "café naïve résumé façade coöperate",
    "cafe\u0301 nai\u0308ve",  # combining marks
    "Ångström Øresund Ærø",
    "ÀÉÎÕÜ àéîõü ß ẞ",
    "Straße groß",
    "Ελληνικά κείμενα",
    "Русский текст, привет мир!",
    "Українська мова",
    "עברית טקסט",
    "العربية نص",
    "हिन्दी पाठ",
    "বাংলা লেখা",
    "தமிழ்",
    "ภาษาไทย",
    "ქართული",
    "Հայերեն",
    "日本語のテキスト",
    "カタカナ ひらがな 漢字",
    "中文文本，你好世界！",
    "繁體中文",
    "한국어 텍스트 안녕하세요",
    "世界 世界世界",
    "mixed 中文 and English 123",
    "Tiếng Việt có dấu",
    "🙂",
    "😀😃😄😁",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "I ❤️ NY",
    "emoji🙂inside",
    "★☆✓✗→←↑↓",
    "∑∫∂√∞≈≠≤≥",
    "½ ¾ ⅓ ² ³ ①②③",
    "Ⅻ ⅻ ௰",
    "٠١٢٣٤٥٦٧٨٩",
    "१२३४",
    "１２３ＡＢＣ",
    "\u00a0non\u00a0breaking\u00a0spaces",
    "ideographic\u3000space",
    "thin\u2009space and\u2002en space",
    "line\u2028separator\u2029para",
    "next\u0085line",
    "zero\u200bwidth\u200djoiner",
    "bom\ufeffhere",
    "soft\u00adhyphen",
    "private\ue000use",
    "unassigned\u0378here",
    "max\U0010ffffcp",
    "tag\U000e0041chars",
    "control\x01\x02\x1f chars",
    "nul\x00byte",
    "del\x7fchar",
    "a\u0300\u0301\u0302\u0303",
    "\u0301leading mark",
    "ǅ ǈ ǋ titlecase",
    "ﬁ ﬂ ligatures",
    "𝓗𝓮𝓵𝓵𝓸 𝕎𝕠𝕣𝕝𝕕",
    "𐍈𐌰𐌹",
    "ab",
    "abc",
    "abcd",
    "aaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the the the the",
    "of the people, by the people, for the people",
    "its a test it is a test",
    "s a s a s a",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua.",
    "Once upon a time, in a land far, far away, there lived a young princess who loved to read "
    "books about dragons, wizards and faraway kingdoms.",
    "A memory pot stores long documents so the model can recall them later.",
    "Explain in two sentences what a memory pot is for long documents.",
    " " * 17 + "x",
    "x" + " " * 33,
    "\t \t \n \n",
    "word\n\n\nword",
    "trailing spaces   \n   leading",
    "tabs\tand\tspaces  mixed \t here",
    "multiple\n\n\n\n\nnewlines",
    " \u3000 \u00a0 ",
    "end with space ",
    "end with newline\n",
    "-" * 40,
    "=" * 25 + "\n" + "=" * 25,
    "#" * 10 + " Heading",
    "* bullet\n* list\n  - nested",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "```python\nprint('hi')\n```",
    "$$ E = mc^2 $$",
    "\\frac{a}{b} + \\sqrt{x}",
    "O'Neil's O'Brien's",
    "rock'n'roll",
    "'quoted' 'll",
    "can' t",
    "l'amour d'abord",
]


def generated(n=110, seed=1234):
    """Random strings from pools of characters that stress the pre-tokenizers."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " ",
        "  \t\n\r",
        ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`",
        "éèêàçñöüßøåæ",
        "日本語中文字世界한국어",
        "🙂😀👍🏽❤️🚀",
        "\u00a0\u3000\u2009\u0301\u200d",
        "²³½①٣१",
        "'sS'tT'rR'eE'lL'dD'mM'vV",
    ]
    words = ["the", "and", "hello", "world", "token", "tokenizer", "people", "of", "it", "is",
             "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|user|>",
             "1234", "   ", "\n\n", "'ll", "don't", "café", "日本語", "a", "aaaa", "2023"]
    out = []
    for i in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.45:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            if rng.random() < 0.5:
                parts.append(" ")
        out.append("".join(parts))
    return out


def all_texts():
    texts = HAND + SPECIAL_SNIPPETS + generated()
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def bos_subset(texts):
    return [t for t in texts if len(t) < 40][:30]


class Vocab:
    def __init__(self, path):
        self.llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text, add_special, parse_special):
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special))

    def piece(self, tid, special):
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_token_to_piece(self.vocab, tid, buf, len(buf), 0, special)
        assert 0 <= n <= len(buf)
        return buf.raw[:n]

    def close(self):
        self.llm.close()


def fnv64(chunks):
    h = 0xCBF29CE484222325
    for c in chunks:
        for b in c:
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def piece_hash(v, special):
    """FNV-1a 64 over (4-byte little-endian length, bytes) of every token's piece."""
    chunks = []
    for i in range(v.n_vocab):
        p = v.piece(i, special)
        chunks.append(len(p).to_bytes(4, "little"))
        chunks.append(p)
    return "%016x" % fnv64(chunks)


def record_vocab(path, name, texts):
    v = Vocab(path)
    try:
        lib = llama_cpp
        eog = [i for i in range(v.n_vocab) if lib.llama_vocab_is_eog(v.vocab, i)]
        sample = sorted(set(list(range(min(300, v.n_vocab))) + list(range(0, v.n_vocab, 97))
                            + [v.n_vocab - 1]))
        doc = {
            "vocab": name,
            "llama_cpp_python": llama_cpp.__version__,
            "n_vocab": v.n_vocab,
            "bos": lib.llama_vocab_bos(v.vocab),
            "eos": lib.llama_vocab_eos(v.vocab),
            "add_bos": bool(lib.llama_vocab_get_add_bos(v.vocab)),
            "add_eos": bool(lib.llama_vocab_get_add_eos(v.vocab)),
            "eog": eog,
            "piece_hash_special": piece_hash(v, True),
            "piece_hash_plain": piece_hash(v, False),
            "pieces": [[i, v.piece(i, True).hex(), v.piece(i, False).hex()] for i in sample],
            "cases": [{"text": t, "plain": v.tokenize(t, False, False),
                       "special": v.tokenize(t, False, True)} for t in texts],
            "bos_cases": [{"text": t, "plain": v.tokenize(t, True, False),
                           "special": v.tokenize(t, True, True)} for t in bos_subset(texts)],
        }
    finally:
        v.close()
    return doc


def copy_with_pre(src, dst, pre):
    """The tokenizer (and the hyper-parameters llama.cpp reads) of src with
    tokenizer.ggml.pre replaced; no tensors."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.ggml.pre":
            continue
        if key == "tokenizer.chat_template":
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
    w.add_key_value("tokenizer.ggml.pre", pre, gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def record_variants(model, texts):
    doc = {"vocab": os.path.basename(model), "llama_cpp_python": llama_cpp.__version__,
           "texts": texts, "variants": {}}
    with tempfile.TemporaryDirectory() as d:
        for pre in PRE_VARIANTS:
            path = os.path.join(d, "v.gguf")
            copy_with_pre(model, path, pre)
            v = Vocab(path)
            try:
                doc["variants"][pre] = [v.tokenize(t, False, True) for t in texts]
            finally:
                v.close()
            os.unlink(path)
    return doc


def dump(doc):
    # one case per line keeps diffs readable
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).replace('},{"text"', '},\n{"text"') + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--spm", default=os.path.join(ROOT, "build", "fixtures", "spm_vocab.gguf"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.spm):
        import subprocess
        subprocess.check_call([sys.executable, os.path.join(ROOT, "tests", "reference", "make_spm_vocab.py"), args.spm])

    texts = all_texts()
    outs = {
        "ref_tokens.json": dump(record_vocab(args.model, os.path.basename(args.model), texts)),
        "ref_tokens_spm.json": dump(record_vocab(args.spm, "spm_vocab.gguf", texts)),
        "ref_tokens_pre.json": dump(record_variants(args.model, texts)),
    }
    bad = 0
    for name, text in outs.items():
        path = os.path.join(FIX, name)
        if args.check:
            try:
                with open(path) as f:
                    old = f.read()
            except FileNotFoundError:
                old = None
            if old != text:
                print(f"{name}: differs from the recorded reference")
                bad = 1
            else:
                print(f"{name}: same ({len(text)} bytes)")
        else:
            os.makedirs(FIX, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path} ({len(text)} bytes, {len(texts)} strings)")
    return bad


if __name__ == "__main__":
    sys.exit(main())
