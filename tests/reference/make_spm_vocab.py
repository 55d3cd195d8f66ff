#!/usr/bin/env python3
"""Writes a tiny SentencePiece-style ("llama") vocabulary GGUF for the tokenizer
tests: <unk>/<s>/</s>, all 256 <0xXX> byte tokens, a few control and
user-defined tokens, and a few hundred English pieces with scores chosen so the
score-driven merging has real choices (ties included). No tensors: llama.cpp
loads it with vocab_only. Deterministic: the same bytes on every run.

    python3 tests/reference/make_spm_vocab.py build/fixtures/spm_vocab.gguf
"""
import os
import sys

import gguf

SP = "\u2581"  # SentencePiece's visible space

# token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

WORDS = """the of and to in is was that for it with as his on be at by had are but from
not have all were when we there can an your which their said if do will each about how up
out them then she many some so these would other into has more her two like him see time
could no make than first been its who now people my made over did down only way find use
may water long little very after words called just where most know get through back much
before go good new write our used me man too any day same right look think also around
another came come work three word must because does part even place well such here take
why things help put years different away again off went old number great tell men say small
every found still between name should home big give air line set own under read last never
us left end along while might next sound below saw something thought both few those always
looked show large often together asked house don't world going want school important until
form food keep children feet land side without boy once animals life enough took sometimes
four head above kind began almost live page got earth need far hand high year mother light
parts country father let night following picture being study second eyes soon times story
boys since white days ever paper hard near sentence better best across during today others
however sure means knew it's try told young miles sun ways thing whole hear example heard
several change answer room sea against top turned learn point city play toward five using
himself usually hello token tokenizer quick brown fox jumps lazy dog café naïve""".split()

ALPHABET = (SP + "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789"
            ".,;:!?'\"()-_/[]{}<>@#$%^&*+=|~`\\éïàü世界日本語中文字")
N_MERGES = 420

def build():
    toks, scores, types = [], [], []

    def add(text, score, typ=NORMAL):
        toks.append(text)
        scores.append(float(score))
        types.append(typ)

    add("<unk>", 0.0, UNKNOWN)
    add("<s>", 0.0, CONTROL)
    add("</s>", 0.0, CONTROL)
    for b in range(256):
        add("<0x%02X>" % b, 0.0, BYTE)
    add("<|im_start|>", 0.0, CONTROL)
    add("<|im_end|>", 0.0, CONTROL)
    add("<|user|>", 0.0, USER_DEFINED)
    add("<mask>", 0.0, USER_DEFINED)
    add("[unused0]", 0.0, UNUSED)

    seen = set(toks)
    score = -1.0

    def piece(text, s=None):
        nonlocal score
        if text in seen:
            return
        seen.add(text)
        add(text, score if s is None else s)
        score -= 1.0

    # the alphabet first, as sentencepiece lists it
    for c in ALPHABET:
        piece(c)
    # then a tiny deterministic BPE "training" over the word list: every merged
    # piece is reachable by merging two earlier pieces, like a real SPM vocab
    corpus = {}
    for i, w in enumerate(WORDS):
        for form in (SP + w, w) if i % 3 == 0 else (SP + w,):
            corpus[tuple(form)] = corpus.get(tuple(form), 0) + 1 + (len(WORDS) - i) // 40
    for _ in range(N_MERGES):
        pairs = {}
        for word, n in corpus.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        (a, b), _n = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = {}
        for word, n in corpus.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        corpus = merged
        piece(a + b)
    # a few pieces with an inner space, and equal-score pieces (ties are broken
    # by position, leftmost first)
    piece(SP + SP)
    piece(SP + SP + SP + SP)
    for p in ("s" + SP, "s" + SP + "a", SP + "of" + SP, SP + "of" + SP + "the"):
        piece(p)
    for p in ("ab", "bc", "cd", "abc", "bcd", "aa", "aaa", "aaaa", "12", "123", "2023", "世界",
              "日本", "日本語", "中文"):
        piece(p, -500.0)
    return toks, scores, types


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_spm_vocab.py OUT.gguf")
    out = sys.argv[1]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    toks, scores, types = build()
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("potserve-spm-test-vocab")
    # hyper-parameters llama.cpp reads even for a vocab-only load
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(toks))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
