/* Tensor element types of the GGUF format and their (de)quantisation
 * (private to engine/). Block layouts follow the GGUF specification; each type
 * packs `quant_block_elems` elements into `quant_block_bytes` bytes. The
 * formats are engine/quant.c; the CPU kernels that multiply with them (from
 * quant_quantize_act on below) are engine/cpu/quant_kernels.c and, for the
 * packed rows, engine/cpu/quant_pack.c. */
#ifndef POTSERVE_QUANT_H
#define POTSERVE_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT_ = 40, /* upper bound of known ids, not a type */
};

/* 1 if potserve can compute with tensors of this type. */
int quant_type_supported(uint32_t type);
/* Name as llama.cpp prints it ("Q4_K"), or "unknown". */
const char *quant_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 for unknown types. */
uint32_t quant_block_elems(uint32_t type);
uint32_t quant_block_bytes(uint32_t type);
/* Bytes of a row of n elements; 0 when n is not a whole number of blocks or
 * the type is unknown. */
size_t quant_row_bytes(uint32_t type, uint64_t n);

/* Dequantises n elements (a whole number of blocks) from src into dst. */
void quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Dot product of a quantised row (n elements of `type`) with f32 x. */
float quant_dot_row(uint32_t type, const void *row, const float *x, int64_t n);

/* IEEE half / bfloat16 conversions (round to nearest even). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

/* ---- llama.cpp-compatible integer dot products --------------------------------
 * llama.cpp does not multiply weights with f32 activations: before each matrix
 * product it converts the activation row to the weight type's "vec_dot_type"
 * (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F16,
 * BF16 or F32 for those weights) and takes integer (f16, bf16) dot products.
 * These functions reproduce that arithmetic (engine/cpu/quant_kernels.c has
 * the details). */

/* The activation format llama.cpp pairs with weights of `type`; GGML_TYPE_COUNT_
 * for a type with no dot product (unknown types, Q8_1, Q8_K). */
uint32_t quant_vec_dot_type(uint32_t type);
/* Bytes of n activations in vec_dot_type(type) format (0 if n is not whole
 * blocks of the weight type, or the type has no dot product). */
size_t quant_act_row_bytes(uint32_t weight_type, int64_t n);
/* Quantizes n f32 activations into the vec_dot_type of weight_type (dst has
 * quant_act_row_bytes(weight_type, n) bytes; any alignment). The AVX2 path
 * (Q8_0, Q8_1, Q8_K) writes the same bytes as the scalar one. */
void quant_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n);
/* Decodes activations written by quant_quantize_act back to n floats (the
 * values the dot product sees); zeros for a type with no dot product. */
void quant_dequantize_act(uint32_t weight_type, const void *act, float *dst, int64_t n);
/* Dot of one weight row (n elements of `type`) with activations produced by
 * quant_quantize_act for that type; 0 for a type with no dot product. The
 * scalar and the SIMD kernels return bit-identical results. */
float quant_vec_dot(uint32_t type, const void *row, const void *act, int64_t n);
/* Several dot products with one weight row: out[i] = quant_vec_dot(type, row,
 * acts + i * act_stride, n) for 0 <= i < n_acts, bit for bit (any n_acts >= 0;
 * out is untouched for n_acts <= 0). The AVX2 kernels (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q4_K, Q5_K, Q6_K) unpack each weight block once for up to eight
 * activation rows and keep their partial sums in registers; other types, and
 * the scalar path, loop over quant_vec_dot. */
void quant_vec_dot_multi(uint32_t type, const void *row, const void *acts, size_t act_stride, int64_t n_acts,
                         int64_t n, float *out);
/* A block of a matrix product: out[t * out_stride + r] = quant_vec_dot(type,
 * rows + r * row_stride, acts + t * act_stride, n) for 0 <= r < n_rows and
 * 0 <= t < n_acts, bit for bit. Walks the activations in cache-sized chunks
 * and uses 2-row x 4-activation tiles where that is faster (Q4_1, Q8_0), else
 * the kernels of quant_vec_dot_multi. Single-threaded: split the rows (or the
 * activations) across threads. */
void quant_matmul(uint32_t type, const void *rows, size_t row_stride, int64_t n_rows, const void *acts,
                  size_t act_stride, int64_t n_acts, int64_t n, float *out, size_t out_stride);
/* ---- eight rows interleaved ("packed") ------------------------------------------
 * A Q4_0, Q4_1 or Q8_0 matrix whose row count is a multiple of 8 can be packed
 * in groups of eight rows, so that one SIMD instruction takes a product for all
 * eight: per 32-element block, the eight rows' scales (halves; for Q4_1 then
 * their mins), then their quants interleaved four bytes at a time (Q8_0's as
 * unsigned bytes, plus 128). The packed matrix has the bytes of the rows
 * (K-quants: see quant_packed_group_bytes).
 *
 * Its arithmetic is not quant_vec_dot's (llama.cpp's eight float lanes per
 * row and block): each block's integer dot isum is summed exactly, then
 *     acc = fma(dx * dy, (float)isum, acc)   and, for Q4_1,   acc = fma(mx, sy, acc)
 * block after block, one float per (row, activation), so one conversion and
 * one multiply-add serve eight rows. It differs from quant_vec_dot in float
 * rounding only; the scalar and SIMD kernels give the same bits (with
 * AVX512-VNNI, two groups per 512-bit register for two or more activations). */

/* 1 if quant_pack_rows takes this matrix (a multiple of 8 rows of a packable
 * type, whole blocks, at most 65,536 columns). Q2_K, Q4_K, Q5_K and Q6_K pack too,
 * with scales unpacked per 256-element super-block (quant_pack.c describes
 * their layout and integer sums); the same float steps per super-block. */
int quant_packable(uint32_t type, int64_t n_rows, int64_t n);
/* Bytes of one packed group of eight rows of n elements (8 rows' bytes, and
 * for Q4_K / Q5_K 32 more per super-block); 0 when not packable. */
size_t quant_packed_group_bytes(uint32_t type, int64_t n);
/* Rewrites n_blocks Q3_K blocks as Q6_K blocks with the same weights exactly
 * (dst: n_blocks * 210 bytes), so that Q3_K matrices take the packed Q6_K
 * kernels (engine/cpu/cpu_backend.c). */
void quant_q3_k_as_q6_k(const void *src, void *dst, int64_t n_blocks);
/* Packs n_rows rows of n elements (row_stride bytes apart) into dst, which
 * has n_rows / 8 * quant_packed_group_bytes(type, n) bytes. */
void quant_pack_rows(uint32_t type, const void *rows, size_t row_stride, int64_t n_rows, int64_t n, void *dst);
/* out[t * out_stride + 8 * g + r] = the product of row r of group g (the
 * groups packed by quant_pack_rows, from `groups` on) with activation t
 * (quant_quantize_act's format), for g < n_groups and t < n_acts. */
void quant_matmul_packed(uint32_t type, const void *groups, int64_t n_groups, const void *acts, size_t act_stride,
                         int64_t n_acts, int64_t n, float *out, size_t out_stride);
/* The same products with the activations laid out beforehand, once for every
 * matrix that reads them ("lanes": eight activations side by side, which the
 * K-quant kernels with AVX512-VNNI read; quant_matmul_packed lays them out
 * per call). quant_packed_lanes_bytes: the room for n_acts activations of n
 * elements, 0 where this type and CPU do not read lanes (then
 * quant_matmul_packed is the way). quant_packed_lanes lays out activations
 * [t0, t1) of n_acts (t0 a multiple of 8; ranges may be laid out in
 * parallel); quant_matmul_packed_lanes then gives quant_matmul_packed's bits
 * for any K-quant type. */
size_t quant_packed_lanes_bytes(uint32_t type, int64_t n_acts, int64_t n);
void quant_packed_lanes(const void *acts, size_t act_stride, int64_t n_acts, int64_t t0, int64_t t1, int64_t n,
                        void *lanes);
void quant_matmul_packed_lanes(uint32_t type, const void *groups, int64_t n_groups, const void *lanes, int64_t n_acts,
                               int64_t n, float *out, size_t out_stride);

/* Kernels quant_vec_dot uses now: "avx2+vnni", "avx2" or "scalar". AVX2 is chosen at run
 * time when the CPU has AVX2, FMA and F16C, unless POTSERVE_NO_SIMD=1 (read once). */
const char *quant_simd_name(void);
/* Test-only: on != 0 forces the portable scalar kernels, 0 restores the default. */
void quant_force_scalar(int on);
/* Test-only: on != 0 keeps the AVX2 kernels off AVX512-VNNI's vpdpbusd (which
 * gives the same bits, one instruction instead of two), 0 restores the default. */
void quant_force_no_vnni(int on);

#endif
