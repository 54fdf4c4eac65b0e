// The order in which the fused BF16 backward's 1-D grids visit (block, head):
// sections of heads, and within a section the block index first.
//
// Every block of the key-outer kernels (and the pair's dkdv kernel) streams
// the query side of its kv head: Q and dO tiles, lse and delta, and adds
// into the FP32 dQ accumulator of those rows; every block of the pair's dq
// kernel streams its kv head's K and V. Blocks of one head running at the
// same time share that stream in L2; blocks of many heads running at the
// same time do not, and their loads and dQ reductions go to DRAM. On the
// H200 (bench/results/ncu-grid-order-h200-2026-12-03.md) the order that
// started every head's first key block before any head's second (one
// section of all heads) hit L2 on 54-73% of sectors and read 4.5 GB from
// DRAM on B2 H16 N8192 d128, where cuDNN's backward hits on 96% and reads
// 0.46 GB.
//
// So the heads are cut into sections whose streams fit in half the L2
// together, and a section's blocks run block index first: under causal
// masking the first blocks (key blocks: the first keys, which see the most
// query tiles; query tiles: counted from the last) are the heaviest, and
// they start before the section's lighter ones. Under causal masking a
// section is also at least two waves of resident blocks, and the sections
// are of equal width (to one head), so that the heaviest blocks of the
// last section do not start in the kernel's last wave and form its tail
// (measured: 64 heads in sections of 9 left one head for the last, and
// took 10% longer than sections of 8). One section of every head is the
// heaviest-first order over all heads.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace gaugewatch::gpu::grid_order {

struct BlockOfHead {
  int block, head;
};

// Block l of a grid of `heads` x `blocks` (l < heads x blocks) in `sections`
// sections (1 <= sections <= heads): the first heads % sections of them
// heads / sections + 1 heads wide, the others heads / sections.
__host__ __device__ __forceinline__ BlockOfHead sectioned(int l, int heads, int blocks, int sections) {
  const int narrow = heads / sections, wide_sections = heads - narrow * sections;
  const int wide_blocks = wide_sections * (narrow + 1) * blocks;  // blocks of the wide sections
  int first, width, in_section;
  if (l < wide_blocks) {
    width = narrow + 1;
    const int k = l / (width * blocks);
    first = k * width;
    in_section = l - k * width * blocks;
  } else {
    width = narrow;
    const int k = (l - wide_blocks) / (width * blocks);
    first = wide_sections * (narrow + 1) + k * width;
    in_section = l - wide_blocks - k * width * blocks;
  }
  return {in_section / width, first + in_section % width};
}

// What section_count weighs.
struct SectionInputs {
  int64_t heads = 1;           // heads of the grid (batch x heads)
  int64_t blocks = 1;          // blocks per head
  int64_t bytes_per_head = 0;  // the stream the blocks of one head share
  bool uneven = false;         // causal masking: work falls along the block index
  int64_t l2_bytes = 0;        // the device's L2
  int64_t resident = 1;        // blocks resident at once (SMs x blocks per SM)
};

// The number of sections (header comment): sections as wide as fill half
// the L2 with their streams, at least one head, under causal masking at
// least two waves of blocks, at most all heads; 1 to heads.
inline int section_count(const SectionInputs& in) {
  if (in.heads <= 1) return 1;
  int64_t width = in.bytes_per_head > 0 ? (in.l2_bytes / 2) / in.bytes_per_head : in.heads;
  if (width < 1) width = 1;
  if (in.uneven && in.blocks > 0) {
    const int64_t waves = (2 * in.resident + in.blocks - 1) / in.blocks;
    if (width < waves) width = waves;
  }
  if (width > in.heads) width = in.heads;
  return static_cast<int>((in.heads + width - 1) / width);
}

// The number of sections of `heads` heads at most `width` wide.
inline int sections_of_width(int64_t heads, int64_t width) {
  if (heads <= 1 || width >= heads) return 1;
  return static_cast<int>((heads + width - 1) / (width < 1 ? 1 : width));
}

}  // namespace gaugewatch::gpu::grid_order
