// CUDA group codecs (interface and payload layout: group_gpu_launchers.h).
//
// The group is one flat index space over a device table of tensors. The
// element-wise passes run over tiles of it (dense_gpu.h): each block takes a
// contiguous share of the tiles, each thread 16-byte vectors of them, and a
// cursor keeps the tensor it last used, stepping to the next one as the
// block walks forward; so every pass is one launch over the whole group
// whatever the number of tensors, at near-copy access patterns.
//
// Passes (each one launch over the group):
//   encode  dense: [reduction of p + header, for onebit/efsignsgd/qsgd/terngrad;
//                   it also finds the non-finite tensors, and is repeated
//                   with them as zeros only if it found one] ->
//                  codes + state update (p recomputed from g and the old state,
//                  s = decode(own payload) per element, state written once);
//                  without a reduction the codes pass finds the non-finite
//                  tensors when there is no state (repeated only if it found
//                  one), else a flags pass of its own runs first;
//           sparse: flags -> compensation into one float32 group buffer (and
//                  the state) -> selection on it (topk/dgc: the single-buffer
//                  selection; randomk: every tensor's draw, k_i of n_i, at
//                  once, randomk_group_select_gpu.cu.h) -> state correction at
//                  the sent slots only;
//           then the markers.
//   decode  markers -> flags; dense: one pass over the group combining every
//           row; sparse: fill (0, NaN for marked tensors), one scatter per row
//           (worker order, as the CPU adds), a division when rows > 1.
// Float arithmetic is rounded step by step (__fadd_rn, __fmul_rn, ...) as the
// CPU kernels round it, so codes, decoded values and state are the CPU's;
// only the float64 sums behind the onebit/efsignsgd/qsgd headers are added in
// another order (last-bit differences of the header, and of what depends on it).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cc/kernels/dense_gpu.h"
#include "cc/kernels/group_gpu_launchers.h"
#include "cc/kernels/payload_size.h"
#include "cc/kernels/random.h"
#include "cc/kernels/randomk_group_select_gpu.cu.h"
#include "cc/kernels/sparse_gpu_launchers.h"
#include "cc/kernels/sparse_select_gpu.cu.h"

namespace tf_mergecomp {
namespace group_gpu {

using gpu::kThreads;

enum Codec { kNone, kFp16, kSignsgd, kOnebit, kEfsignsgd, kQsgd, kTerngrad, kTopk, kDgc, kRandomk };

struct CodecName {
  const char* name;
  Codec codec;
};
constexpr CodecName kCodecs[] = {
    {"none", kNone},           {"fp16", kFp16}, {"signsgd", kSignsgd}, {"onebit", kOnebit},
    {"efsignsgd", kEfsignsgd}, {"qsgd", kQsgd}, {"terngrad", kTerngrad}, {"topk", kTopk},
    {"dgc", kDgc},             {"randomk", kRandomk}};

bool LookUp(const char* name, Codec* codec) {
  if (name == nullptr) return false;
  for (const CodecName& entry : kCodecs) {
    if (strcmp(entry.name, name) == 0) {
      *codec = entry.codec;
      return true;
    }
  }
  return false;
}

bool IsSparse(Codec codec) { return codec == kTopk || codec == kDgc || codec == kRandomk; }

// ---- the group on the device ---------------------------------------------

struct DeviceGroup {
  int64_t num_tensors;
  int64_t total;
  const int64_t* offsets;

  __device__ int64_t TensorAt(int64_t i) const { return gpu::SegmentAt(offsets, num_tensors, i); }
};

// The tensor of a thread's current element (gpu::SegmentCursor over the group's tensors).
struct Cursor : gpu::SegmentCursor {
  __device__ void Seek(const DeviceGroup& group, int64_t i) {
    SegmentCursor::Seek(group.offsets, group.num_tensors, i);
  }
};

// Where a thread's vector of kVector flat elements [first, first + kVector)
// lies: whole (all in tensor t, from its position j) or not (it straddles a
// tensor boundary or the group's end, and its elements are looked up one by
// one: rare).
struct VectorPlace {
  int64_t first;
  int64_t t;
  int64_t j;
  int64_t size;
  bool whole;

  __device__ void Find(const DeviceGroup& group, Cursor& c, int64_t first_element) {
    first = first_element;
    whole = false;
    if (first >= group.total) return;
    c.Seek(group, first);
    t = c.t;
    j = first - c.begin;
    size = c.size();
    whole = first + gpu::kVector <= c.end;
  }
  __device__ bool Valid(const DeviceGroup& group, int e) const {
    return whole || first + e < group.total;
  }
  // The tensor, position and tensor size of element e (valid).
  __device__ void Element(const DeviceGroup& group, int e, int64_t* te, int64_t* je,
                          int64_t* size_e) const {
    if (whole) {
      *te = t;
      *je = j + e;
      *size_e = size;
      return;
    }
    *te = group.TensorAt(first + e);
    *je = first + e - group.offsets[*te];
    *size_e = group.offsets[*te + 1] - group.offsets[*te];
  }
};

// A vector's values as a pass loads them: the gradients as stored (finite
// or not) and the memory's state.
struct VectorValues {
  float raw[gpu::kVector];
  float a[gpu::kVector];  // residual e, momentum m or dgc u (0 without memory)
  float b[gpu::kVector];  // dgc v
};

// The memory's compensation and state update (group_op.cc's, rounding
// alike). The state is written only when no tensor of the group is
// non-finite (*any_nonfinite == 0); a non-finite tensor reads as zeros.
//
// The flags are found by the first pass that reads the gradients (a pass
// that "finds" them takes every gradient as stored and marks the tensors
// holding an inf or a NaN); the passes after it know them.
struct DeviceMemory {
  int kind;
  float decay;
  float gradient_scale;
  const float* const* inputs;
  float* const* state;
  int32_t* nonfinite;
  int32_t* any_nonfinite;

  __device__ bool HasState() const { return kind != MERGECOMP_MEMORY_NONE; }
  __device__ bool Commit() const { return HasState() && *any_nonfinite == 0; }

  __device__ void Load(const DeviceGroup& group, const VectorPlace& q, VectorValues* v,
                       bool with_state) const {
    if (q.whole) {
      gpu::Load4(inputs[q.t] + q.j, v->raw);
      if (with_state && HasState()) gpu::Load4(state[q.t] + q.j, v->a);
      if (with_state && kind == MERGECOMP_MEMORY_DGC) gpu::Load4(state[q.t] + q.size + q.j, v->b);
      return;
    }
#pragma unroll
    for (int e = 0; e < gpu::kVector; ++e) {
      v->raw[e] = v->a[e] = v->b[e] = 0.0f;
      if (!q.Valid(group, e)) continue;
      int64_t t, j, size;
      q.Element(group, e, &t, &j, &size);
      v->raw[e] = inputs[t][j];
      if (with_state && HasState()) v->a[e] = state[t][j];
      if (with_state && kind == MERGECOMP_MEMORY_DGC) v->b[e] = state[t][size + j];
    }
  }

  // Writes new state values a (and b for dgc) of a vector's valid elements.
  __device__ void Store(const DeviceGroup& group, const VectorPlace& q, const float a[],
                        const float b[]) const {
    if (q.whole) {
      gpu::Store4(state[q.t] + q.j, a);
      if (kind == MERGECOMP_MEMORY_DGC) gpu::Store4(state[q.t] + q.size + q.j, b);
      return;
    }
#pragma unroll
    for (int e = 0; e < gpu::kVector; ++e) {
      if (!q.Valid(group, e)) continue;
      int64_t t, j, size;
      q.Element(group, e, &t, &j, &size);
      state[t][j] = a[e];
      if (kind == MERGECOMP_MEMORY_DGC) state[t][size + j] = b[e];
    }
  }

  // The gradients as the codec sees them: 0 in a tensor marked non-finite
  // (when the flags are known), 0 past the group's end.
  __device__ void Gradients(const DeviceGroup& group, const VectorPlace& q,
                            const VectorValues& v, bool flags_known, float g[]) const {
    const bool whole_zero = q.whole && flags_known && nonfinite[q.t] != 0;
#pragma unroll
    for (int e = 0; e < gpu::kVector; ++e) {
      g[e] = whole_zero ? 0.0f : v.raw[e];
      if (q.whole || !q.Valid(group, e)) {
        if (!q.Valid(group, e)) g[e] = 0.0f;
        continue;
      }
      if (flags_known && nonfinite[group.TensorAt(q.first + e)] != 0) g[e] = 0.0f;
    }
  }

  // Marks the tensors of a vector's non-finite gradients (the pass that
  // finds the flags). Lanes of a warp mostly share a tensor: one lane marks
  // it once per run; a vector across tensors marks element by element.
  // Returns whether this thread found one. Every lane of the warp calls it.
  __device__ bool MarkNonFinite(const DeviceGroup& group, const VectorPlace& q,
                                const VectorValues& v) const {
    bool bad = false;
#pragma unroll
    for (int e = 0; e < gpu::kVector; ++e) {
      const bool element_bad = q.Valid(group, e) &&
                               (__float_as_uint(v.raw[e]) & 0x7f800000u) == 0x7f800000u;
      if (element_bad && !q.whole) atomicExch(&nonfinite[group.TensorAt(q.first + e)], 1);
      bad |= element_bad;
    }
    const bool whole_bad = bad && q.whole;
    const unsigned mask = __ballot_sync(0xffffffffu, whole_bad);
    if (mask != 0) {
      const int lane = threadIdx.x & 31;
      const int leader = __ffs(mask) - 1;
      const long long leader_t =
          __shfl_sync(0xffffffffu, static_cast<long long>(whole_bad ? q.t : -1), leader);
      if (whole_bad && (lane == leader || q.t != leader_t)) atomicExch(&nonfinite[q.t], 1);
    }
    return bad;
  }

  // u <- decay * u + g of the dgc memory, from the old u.
  __device__ float NewMomentum(float u, float g) const {
    return __fadd_rn(__fmul_rn(decay, u), g);
  }

  // p of element e from its gradient g and the old state.
  __device__ float Compensated(const VectorValues& v, int e, float g) const {
    switch (kind) {
      case MERGECOMP_MEMORY_RESIDUAL: return __fadd_rn(g, v.a[e]);
      case MERGECOMP_MEMORY_MOMENTUM:
        return __fadd_rn(__fmul_rn(decay, v.a[e]), __fmul_rn(gradient_scale, g));
      case MERGECOMP_MEMORY_DGC: return __fadd_rn(v.b[e], NewMomentum(v.a[e], g));
      default: return g;
    }
  }

  // Dense codecs, after encoding: element e's new state from p and s (this
  // worker's own decoded value of the element).
  __device__ void Updated(const VectorValues& v, int e, float g, float p, float s, float* a,
                          float* b) const {
    switch (kind) {
      case MERGECOMP_MEMORY_RESIDUAL: *a = __fsub_rn(p, s); return;
      case MERGECOMP_MEMORY_MOMENTUM: *a = p; return;
      case MERGECOMP_MEMORY_DGC:
        *a = __fmul_rn(NewMomentum(v.a[e], g), s == 0.0f ? 1.0f : 0.0f);
        *b = __fsub_rn(p, s);
        return;
      default: return;
    }
  }

  // Sparse codecs: the compensated state (residual e <- p, from which the
  // sent entries are subtracted later; momentum m <- p; dgc u, v).
  __device__ void CompensatedState(const VectorValues& v, int e, float g, float p, float* a,
                                   float* b) const {
    if (kind == MERGECOMP_MEMORY_DGC) {
      *a = NewMomentum(v.a[e], g);
      *b = p;
    } else {
      *a = p;
    }
  }
};

// How a pass over the gradients treats the non-finite flags.
enum FlagsMode {
  kFlagsKnown = 0,    // found by an earlier pass
  kFindFlags = 1,     // this pass finds them, taking every gradient as stored
  kRedoIfFound = 2,   // a repeat of the finding pass with the flags known, run
                      // only when it found a non-finite tensor (else returns at once)
};

// Calls fn(place) for each vector of the calling block's tiles, a tile's
// kUnroll vectors placed (and loaded by fn's caller) before any is used.
// Every thread of the block runs the same number of rounds.
template <typename TileFn>
__device__ __forceinline__ void ForEachTile(const DeviceGroup& group, const TileFn& fn) {
  Cursor cursor;
  const gpu::TileRange tiles = gpu::TilesOfBlock(group.total);
  for (int64_t tile = tiles.begin; tile < tiles.end; ++tile) {
    VectorPlace places[gpu::kUnroll];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) places[u].Find(group, cursor, gpu::TileVector(tile, u));
    fn(places);
  }
}

// ---- encode: flags and markers --------------------------------------------

// The flags alone, for the codecs whose first pass over the gradients writes
// the state (memories without a reduction pass before their codes).
MERGECOMP_TILE_KERNEL NonFiniteKernel(DeviceGroup group, DeviceMemory memory) {
  bool found = false;
  ForEachTile(group, [&](const VectorPlace* places) {
    VectorValues v[gpu::kUnroll];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) memory.Load(group, places[u], &v[u], false);
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) found |= memory.MarkNonFinite(group, places[u], v[u]);
  });
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicExch(memory.any_nonfinite, 1);
}

// One payload element per tensor: 1 (as uint8, float16 or float32) where
// the tensor is non-finite, else 0.
__global__ void MarkersKernel(int64_t num_tensors, const int32_t* nonfinite, int marker_bytes,
                              uint8_t* markers) {
  gpu::ForEachIndex(num_tensors, [&](int64_t t) {
    const bool set = nonfinite[t] != 0;
    uint8_t* out = markers + t * marker_bytes;
    if (marker_bytes == 1) {
      out[0] = set ? 1 : 0;
    } else if (marker_bytes == 2) {
      out[0] = 0;
      out[1] = set ? 0x3c : 0;  // float16 1.0 = 0x3c00
    } else {
      out[0] = 0;
      out[1] = 0;
      out[2] = set ? 0x80 : 0;  // float32 1.0 = 0x3f800000
      out[3] = set ? 0x3f : 0;
    }
  });
}

__device__ __forceinline__ bool MarkerSet(const uint8_t* markers, int64_t t, int marker_bytes) {
  const uint8_t* m = markers + t * marker_bytes;
  if (marker_bytes == 1) return m[0] != 0;
  if (marker_bytes == 2) return ((m[0] | (m[1] << 8)) & 0x7fff) != 0;  // != +-0
  uint32_t bits = m[0] | (m[1] << 8) | (m[2] << 16) | (uint32_t{m[3]} << 24);
  return (bits & 0x7fffffffu) != 0;
}

__global__ void FlagsFromMarkersKernel(int64_t num_tensors, const uint8_t* rows, int64_t num_rows,
                                       int64_t row_bytes, int64_t payload_bytes, int marker_bytes,
                                       int32_t* nonfinite) {
  gpu::ForEachIndex(num_tensors, [&](int64_t t) {
    int32_t set = 0;
    for (int64_t w = 0; w < num_rows; ++w) {
      set |= MarkerSet(rows + w * row_bytes + payload_bytes, t, marker_bytes);
    }
    nonfinite[t] = set;
  });
}

// ---- encode: dense codecs ---------------------------------------------------

// Per-block partials of the header's reduction over p: onebit (sum of the
// "+" side, of the "-" side, count of "+"), efsignsgd (sum |p|), qsgd (sum
// p^2), terngrad (max |p|, any NaN). A fixed grid splits the tiles in
// contiguous shares, so the partials do not depend on timing. The first pass
// over the gradients: with kFindFlags it marks the non-finite tensors too,
// and its kRedoIfFound repeat recomputes the partials with them as zeros.
template <Codec kCodec>
MERGECOMP_TILE_KERNEL ReduceKernel(DeviceGroup group, DeviceMemory memory, double* partials,
                                   int mode) {
  if (mode == kRedoIfFound && *memory.any_nonfinite == 0) return;
  __shared__ double shared[kThreads];
  double a = 0.0, b = 0.0, c = 0.0;
  bool found = false;
  ForEachTile(group, [&](const VectorPlace* places) {
    VectorValues v[gpu::kUnroll];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) memory.Load(group, places[u], &v[u], true);
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      if (mode == kFindFlags) found |= memory.MarkNonFinite(group, places[u], v[u]);
      float g[gpu::kVector];
      memory.Gradients(group, places[u], v[u], mode != kFindFlags, g);
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        if (!places[u].Valid(group, e)) continue;
        const float p = memory.Compensated(v[u], e, g[e]);
        if (kCodec == kOnebit) {
          const bool plus = IsNonNegative(p);
          a += plus ? static_cast<double>(p) : 0.0;
          b += plus ? 0.0 : static_cast<double>(p);
          c += plus ? 1.0 : 0.0;
        } else if (kCodec == kEfsignsgd) {
          a += fabs(static_cast<double>(p));
        } else if (kCodec == kQsgd) {
          a += static_cast<double>(p) * static_cast<double>(p);  // exact in double
        } else {  // kTerngrad
          const float magnitude = fabsf(p);
          if (magnitude != magnitude) {
            b = 1.0;
          } else if (magnitude > a) {
            a = magnitude;
          }
        }
      }
    }
  });
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicExch(memory.any_nonfinite, 1);
  double* mine = partials + blockIdx.x * gpu::kReduceFields;
  if (kCodec == kTerngrad) {
    a = gpu::BlockReduce(a, shared, gpu::MaxOp());
    b = gpu::BlockReduce(b, shared, gpu::MaxOp());
  } else {
    a = gpu::BlockSum(a, shared);
    if (kCodec == kOnebit) {
      b = gpu::BlockSum(b, shared);
      c = gpu::BlockSum(c, shared);
    }
  }
  if (threadIdx.x == 0) {
    mine[0] = a;
    mine[1] = b;
    mine[2] = c;
  }
}

// One block: the header from the partials, as the CPU kernels compute it.
template <Codec kCodec>
__global__ void HeaderKernel(const double* partials, int count, int64_t n, uint8_t* row) {
  __shared__ double shared[kThreads];
  if (kCodec == kTerngrad) {
    double max_abs = 0.0, has_nan = 0.0;
    for (int b = threadIdx.x; b < count; b += kThreads) {
      max_abs = fmax(max_abs, partials[b * gpu::kReduceFields]);
      has_nan = fmax(has_nan, partials[b * gpu::kReduceFields + 1]);
    }
    max_abs = gpu::BlockReduce(max_abs, shared, gpu::MaxOp());
    has_nan = gpu::BlockReduce(has_nan, shared, gpu::MaxOp());
    if (threadIdx.x == 0) {
      StoreFloat(row, has_nan != 0.0 ? __int_as_float(0x7fc00000) : static_cast<float>(max_abs));
    }
    return;
  }
  const double a = gpu::SumPartials(partials, count, 0, shared);
  if (kCodec == kOnebit) {
    const double b = gpu::SumPartials(partials, count, 1, shared);
    const double positive_count = gpu::SumPartials(partials, count, 2, shared);
    if (threadIdx.x == 0) {
      const double negative_count = static_cast<double>(n) - positive_count;
      StoreFloat(row, positive_count > 0 ? static_cast<float>(a / positive_count) : 0.0f);
      StoreFloat(row + 4, negative_count > 0 ? static_cast<float>(b / negative_count) : 0.0f);
    }
  } else if (threadIdx.x == 0) {
    if (kCodec == kEfsignsgd) {
      StoreFloat(row, n > 0 ? static_cast<float>(a / static_cast<double>(n)) : 0.0f);
    } else {  // kQsgd
      StoreFloat(row, static_cast<float>(sqrt(a)));
    }
  }
}

struct CodeParams {
  SeedKey key;
  int64_t levels;  // qsgd
  int bits;        // qsgd code width
};

// Bits per element of the codes pass's packed payloads (0: float values).
template <Codec kCodec>
__device__ __forceinline__ int CodeBits(const CodeParams& params) {
  return kCodec == kQsgd ? params.bits
                         : (kCodec == kTerngrad ? 2 : (kCodec == kFp16 || kCodec == kNone ? 0 : 1));
}

template <Codec kCodec>
__host__ __device__ constexpr int64_t CodesHeaderBytes() {
  return kCodec == kOnebit      ? kOnebitHeaderBytes
         : kCodec == kEfsignsgd ? kEfsignsgdHeaderBytes
         : kCodec == kQsgd      ? kQsgdHeaderBytes
         : kCodec == kTerngrad  ? kTerngradHeaderBytes
                                : 0;
}

// Codes of the group (and the state update) in one pass over tiles; headers
// were written by HeaderKernel before. Packed codes go out a warp at a time
// (gpu::WarpPackCodes), float and float16 values a vector at a time. Without
// memory and without a header this is the first pass over the gradients
// (kFindFlags), repeated (kRedoIfFound) for a group that holds a non-finite
// tensor.
template <Codec kCodec>
MERGECOMP_TILE_KERNEL CodesKernel(DeviceGroup group, DeviceMemory memory, CodeParams params,
                                  uint8_t* row, int64_t code_bytes, int mode) {
  if (mode == kRedoIfFound && *memory.any_nonfinite == 0) return;
  __shared__ uint32_t pack_scratch[kThreads * gpu::kVector];
  const bool flags_known = mode != kFindFlags;
  const bool commit = memory.Commit() && mode == kFlagsKnown;
  float hi = 1.0f, lo = -1.0f;  // signsgd: the majority of one row is its own sign
  if (kCodec == kOnebit) {
    hi = LoadFloat(row);
    lo = LoadFloat(row + 4);
  } else if (kCodec == kEfsignsgd) {
    hi = LoadFloat(row);
    lo = -hi;
  }
  const float levels = static_cast<float>(params.levels);
  const float qsgd_scale = kCodec == kQsgd ? gpu::QsgdScale(LoadFloat(row), levels) : 0.0f;
  const float qsgd_unit = kCodec == kQsgd ? __fdiv_rn(LoadFloat(row), levels) : 0.0f;
  const float max_abs = kCodec == kTerngrad ? LoadFloat(row) : 0.0f;
  const int bits = CodeBits<kCodec>(params);
  uint8_t* codes = row + CodesHeaderBytes<kCodec>();
  const bool codes_aligned = (reinterpret_cast<uintptr_t>(codes) & 3) == 0;
  uint32_t* warp_scratch = pack_scratch + (threadIdx.x & ~31) * gpu::kVector;
  bool found = false;

  ForEachTile(group, [&](const VectorPlace* places) {
    VectorValues v[gpu::kUnroll];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) memory.Load(group, places[u], &v[u], true);
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const VectorPlace& q = places[u];
      if (mode == kFindFlags) found |= memory.MarkNonFinite(group, q, v[u]);
      float g[gpu::kVector];
      memory.Gradients(group, q, v[u], flags_known, g);
      uint32_t code[gpu::kVector];
      float value[gpu::kVector], new_a[gpu::kVector], new_b[gpu::kVector];
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        const int64_t i = q.first + e;
        const float p = memory.Compensated(v[u], e, g[e]);
        float s;
        code[e] = 0;
        if (kCodec == kNone) {
          value[e] = s = p;
        } else if (kCodec == kFp16) {
          value[e] = p;
          s = __half2float(__float2half_rn(p));
        } else if (kCodec == kQsgd) {
          code[e] = gpu::QsgdCode(p, qsgd_scale, levels, params.key, i);
          s = __fmul_rn(static_cast<float>(static_cast<int32_t>(code[e]) -
                                           static_cast<int32_t>(params.levels)),
                        qsgd_unit);
        } else if (kCodec == kTerngrad) {
          code[e] = gpu::TernaryCode(p, max_abs, params.key, i);
          s = __fmul_rn(max_abs, gpu::TernaryValue(code[e]));
        } else {  // sign codecs
          const bool plus = IsNonNegative(p);
          code[e] = plus ? 1u : 0u;
          s = plus ? hi : lo;
        }
        if (!q.Valid(group, e)) code[e] = 0;
        memory.Updated(v[u], e, g[e], p, s, &new_a[e], &new_b[e]);
      }
      if (commit) memory.Store(group, q, new_a, new_b);
      if (kCodec == kNone || kCodec == kFp16) {
        const bool full = q.first + gpu::kVector <= group.total;
        if (kCodec == kNone && full) {
          gpu::Store4(reinterpret_cast<float*>(row) + q.first, value);
        } else if (kCodec == kFp16 && full &&
                   (reinterpret_cast<uintptr_t>(row + 2 * q.first) & 7) == 0) {
          const __half2 low = __floats2half2_rn(value[0], value[1]);
          const __half2 high = __floats2half2_rn(value[2], value[3]);
          uint2 packed;
          memcpy(&packed.x, &low, 4);
          memcpy(&packed.y, &high, 4);
          *reinterpret_cast<uint2*>(row + 2 * q.first) = packed;
        } else {
#pragma unroll
          for (int e = 0; e < gpu::kVector; ++e) {
            if (!q.Valid(group, e)) continue;
            if (kCodec == kNone) {
              reinterpret_cast<float*>(row)[q.first + e] = value[e];
            } else {
              reinterpret_cast<__half*>(row)[q.first + e] = __float2half_rn(value[e]);
            }
          }
        }
      } else {
        gpu::WarpPackCodes(code, bits, q.first / (32 * gpu::kVector), codes, code_bytes,
                           codes_aligned, warp_scratch);
      }
    }
  });
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicExch(memory.any_nonfinite, 1);
}

// ---- encode: sparse codecs ---------------------------------------------------

MERGECOMP_TILE_KERNEL CompensateKernel(DeviceGroup group, DeviceMemory memory, float* p) {
  const bool commit = memory.Commit();
  ForEachTile(group, [&](const VectorPlace* places) {
    VectorValues v[gpu::kUnroll];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) memory.Load(group, places[u], &v[u], true);
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const VectorPlace& q = places[u];
      float g[gpu::kVector], value[gpu::kVector], new_a[gpu::kVector], new_b[gpu::kVector];
      memory.Gradients(group, q, v[u], true, g);
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        value[e] = memory.Compensated(v[u], e, g[e]);
        memory.CompensatedState(v[u], e, g[e], value[e], &new_a[e], &new_b[e]);
      }
      if (q.first + gpu::kVector <= group.total) {
        gpu::Store4(p + q.first, value);
      } else {
        for (int e = 0; e < gpu::kVector; ++e) {
          if (q.Valid(group, e)) p[q.first + e] = value[e];
        }
      }
      if (commit) memory.Store(group, q, new_a, new_b);
    }
  });
}

// Random-k's scale n_i / k_i, rounded to float32 once (1 without scale).
__device__ __forceinline__ float RandomkScale(const DeviceGroup& group, const int64_t* tensor_k,
                                              int scale, int64_t t) {
  const int64_t k = tensor_k[t];
  const int64_t n = group.offsets[t + 1] - group.offsets[t];
  return scale && k > 0 ? static_cast<float>(static_cast<double>(n) / static_cast<double>(k))
                        : 1.0f;
}

// The state at the sent entries: residual e <- e - sent; dgc v <- v - sent,
// u <- u * (sent == 0). Slots are the payload's (topk/dgc: values then
// indices) or random-k's (values, positions in codec_context).
__global__ void CorrectSentKernel(DeviceGroup group, DeviceMemory memory, int64_t slots,
                                  const float* values, const int32_t* indices,
                                  const int64_t* tensor_k, int scale) {
  if (!memory.Commit()) return;
  gpu::ForEachIndex(slots, [&](int64_t slot) {
    // A slot sending 0 leaves the state as it is (e - 0, v - 0, u * 1); skipping
    // it keeps DGC's padding slots (0 at index 0) from racing with a real
    // slot at index 0 when fewer than k candidates exist.
    if (values[slot] == 0.0f) return;
    const int64_t index = indices[slot];
    const int64_t t = group.TensorAt(index);
    const int64_t j = index - group.offsets[t];
    const float value =
        tensor_k != nullptr && scale ? __fmul_rn(values[slot], RandomkScale(group, tensor_k, 1, t))
                                     : values[slot];
    float* buffer = memory.state[t];
    if (memory.kind == MERGECOMP_MEMORY_RESIDUAL) {
      buffer[j] = __fsub_rn(buffer[j], value);
    } else if (memory.kind == MERGECOMP_MEMORY_DGC) {
      const int64_t n = group.offsets[t + 1] - group.offsets[t];
      buffer[n + j] = __fsub_rn(buffer[n + j], value);
      buffer[j] = __fmul_rn(buffer[j], value == 0.0f ? 1.0f : 0.0f);
    }
  });
}

// ---- decode ------------------------------------------------------------------

// Writes a vector's values of valid elements to the outputs (one 16-byte
// store where the vector is whole and aligned).
__device__ __forceinline__ void StoreOutputs(const DeviceGroup& group, float* const* outputs,
                                             const VectorPlace& q, const float values[]) {
  if (q.whole) {
    gpu::Store4(outputs[q.t] + q.j, values);
    return;
  }
#pragma unroll
  for (int e = 0; e < gpu::kVector; ++e) {
    if (!q.Valid(group, e)) continue;
    int64_t t, j, size;
    q.Element(group, e, &t, &j, &size);
    outputs[t][j] = values[e];
  }
}

// Whether element e's tensor is marked non-finite.
__device__ __forceinline__ bool Marked(const DeviceGroup& group, const VectorPlace& q, int e,
                                       const int32_t* nonfinite) {
  return nonfinite[q.whole ? q.t : group.TensorAt(q.first + e)] != 0;
}

template <Codec kCodec>
MERGECOMP_TILE_KERNEL DenseDecodeKernel(DeviceGroup group, float* const* outputs,
                                        const uint8_t* rows, int64_t num_rows, int64_t row_bytes,
                                        int64_t levels, int bits, const int32_t* nonfinite) {
  const float divisor = static_cast<float>(num_rows);
  const float levels_f = static_cast<float>(levels);
  ForEachTile(group, [&](const VectorPlace* places) {
    float result[gpu::kUnroll][gpu::kVector];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const VectorPlace& q = places[u];
      if (kCodec == kNone && q.first + gpu::kVector <= group.total) {
        gpu::Load4(reinterpret_cast<const float*>(rows) + q.first, result[u]);
        continue;
      }
      if (kCodec == kFp16 && q.first + gpu::kVector <= group.total &&
          (reinterpret_cast<uintptr_t>(rows + 2 * q.first) & 7) == 0) {
        // Four float16 values in one 8-byte load.
        const uint2 packed = *reinterpret_cast<const uint2*>(rows + 2 * q.first);
        const uint32_t halves[2] = {packed.x, packed.y};
#pragma unroll
        for (int e = 0; e < gpu::kVector; ++e) {
          result[u][e] = __half2float(
              __ushort_as_half(static_cast<unsigned short>(halves[e / 2] >> (16 * (e % 2)))));
        }
        continue;
      }
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) result[u][e] = 0.0f;
      if (!q.Valid(group, 0)) continue;  // past the group's end
      if (kCodec == kNone || kCodec == kFp16) {  // a vector across the end: one by one
#pragma unroll
        for (int e = 0; e < gpu::kVector; ++e) {
          if (!q.Valid(group, e)) continue;
          result[u][e] = kCodec == kNone
                             ? reinterpret_cast<const float*>(rows)[q.first + e]
                             : __half2float(reinterpret_cast<const __half*>(rows)[q.first + e]);
        }
        continue;
      }
      // Row by row, each row's header and the vector's code bits read once
      // (a vector's 4 elements share one byte of sign bits or of 2-bit codes,
      // first being a multiple of 4); each element's sum in row order, as the CPU adds.
      int votes[gpu::kVector] = {0, 0, 0, 0};
      float total[gpu::kVector] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t w = 0; w < num_rows; ++w) {
        const uint8_t* row = rows + w * row_bytes;
        float v[gpu::kVector];
        if (kCodec == kSignsgd || kCodec == kOnebit || kCodec == kEfsignsgd) {
          const int64_t header = kCodec == kOnebit      ? kOnebitHeaderBytes
                                 : kCodec == kEfsignsgd ? kEfsignsgdHeaderBytes
                                                        : 0;
          const uint32_t signs = row[header + (q.first >> 3)] >> (q.first & 7);
          const float hi = kCodec == kSignsgd ? 1.0f : LoadFloat(row);
          const float lo = kCodec == kOnebit ? LoadFloat(row + 4) : -hi;
#pragma unroll
          for (int e = 0; e < gpu::kVector; ++e) {
            const bool plus = (signs >> e) & 1u;
            votes[e] += plus ? 1 : -1;
            v[e] = plus ? hi : lo;
          }
        } else if (kCodec == kQsgd) {
          const float unit = __fdiv_rn(LoadFloat(row), levels_f);
#pragma unroll
          for (int e = 0; e < gpu::kVector; ++e) {
            v[e] = q.Valid(group, e)
                       ? __fmul_rn(static_cast<float>(
                                       gpu::CodeAt(row + kQsgdHeaderBytes, q.first + e, bits) -
                                       static_cast<int32_t>(levels)),
                                   unit)
                       : 0.0f;
          }
        } else {  // kTerngrad: the vector's four 2-bit codes are one byte
          const uint32_t codes = row[kTerngradHeaderBytes + (q.first >> 2)];
          const float max_abs = LoadFloat(row);
#pragma unroll
          for (int e = 0; e < gpu::kVector; ++e) {
            v[e] = __fmul_rn(max_abs, gpu::TernaryValue((codes >> (2 * e)) & 3u));
          }
        }
#pragma unroll
        for (int e = 0; e < gpu::kVector; ++e) total[e] = w == 0 ? v[e] : __fadd_rn(total[e], v[e]);
      }
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        result[u][e] = kCodec == kSignsgd ? (votes[e] >= 0 ? 1.0f : -1.0f)
                                          : __fdiv_rn(total[e], divisor);
      }
    }
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        if (places[u].Valid(group, e) && Marked(group, places[u], e, nonfinite)) {
          result[u][e] = __int_as_float(0x7fc00000);
        }
      }
      StoreOutputs(group, outputs, places[u], result[u]);
    }
  });
}

// Sparse decode's start: 0 everywhere, NaN in the tensors a row marked
// non-finite (which the scatters then leave alone).
MERGECOMP_TILE_KERNEL FillKernel(DeviceGroup group, float* const* outputs,
                                 const int32_t* nonfinite) {
  ForEachTile(group, [&](const VectorPlace* places) {
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      float values[gpu::kVector];
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        values[e] = places[u].Valid(group, e) && Marked(group, places[u], e, nonfinite)
                        ? __int_as_float(0x7fc00000)
                        : 0.0f;
      }
      StoreOutputs(group, outputs, places[u], values);
    }
  });
}

__device__ __forceinline__ int32_t LoadInt32(const uint8_t* bytes) {
  int32_t value;
  memcpy(&value, bytes, sizeof(value));
  return value;
}

// Adds one row's k slots (topk/dgc) into the outputs. Within a row indices
// are distinct except dgc's padding slots, which add 0: the atomics do not
// make the sum order-dependent. Rows lie back to back at any byte offset
// (8k payload bytes, then the markers), so slots are read bytewise. An
// index outside the group sets *bad_index; a marked tensor stays NaN.
__global__ void ScatterAddKernel(DeviceGroup group, float* const* outputs, const uint8_t* row,
                                 int64_t k, const int32_t* nonfinite, int32_t* bad_index) {
  gpu::ForEachIndex(k, [&](int64_t slot) {
    const int64_t index = LoadInt32(row + 4 * k + 4 * slot);
    if (index < 0 || index >= group.total) {
      atomicExch(bad_index, 1);
      return;
    }
    const int64_t t = group.TensorAt(index);
    if (nonfinite[t]) return;
    atomicAdd(outputs[t] + (index - group.offsets[t]), LoadFloat(row + 4 * slot));
  });
}

// Random-k: output[position] = value (scaled), as the CPU assigns.
__global__ void ScatterAssignKernel(DeviceGroup group, float* const* outputs, const float* values,
                                    const int32_t* positions, int64_t slots,
                                    const int64_t* tensor_k, int scale, const int32_t* nonfinite,
                                    int32_t* bad_index) {
  gpu::ForEachIndex(slots, [&](int64_t slot) {
    const int64_t index = positions[slot];
    if (index < 0 || index >= group.total) {
      atomicExch(bad_index, 1);
      return;
    }
    const int64_t t = group.TensorAt(index);
    if (nonfinite[t]) return;
    const float value =
        scale ? __fmul_rn(values[slot], RandomkScale(group, tensor_k, 1, t)) : values[slot];
    outputs[t][index - group.offsets[t]] = value;
  });
}

// More than one row: divides the sums by the number of rows (a marked
// tensor's NaN stays as FillKernel wrote it).
MERGECOMP_TILE_KERNEL DivideKernel(DeviceGroup group, float* const* outputs, int64_t num_rows,
                                   const int32_t* nonfinite) {
  const float divisor = static_cast<float>(num_rows);
  ForEachTile(group, [&](const VectorPlace* places) {
    float sums[gpu::kUnroll][gpu::kVector];
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
      const VectorPlace& q = places[u];
      if (q.whole) {
        gpu::Load4(outputs[q.t] + q.j, sums[u]);
        continue;
      }
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        sums[u][e] = 0.0f;
        if (!q.Valid(group, e)) continue;
        int64_t t, j, size;
        q.Element(group, e, &t, &j, &size);
        sums[u][e] = outputs[t][j];
      }
    }
#pragma unroll
    for (int u = 0; u < gpu::kUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < gpu::kVector; ++e) {
        if (!(places[u].Valid(group, e) && Marked(group, places[u], e, nonfinite))) {
          sums[u][e] = __fdiv_rn(sums[u][e], divisor);
        }
      }
      StoreOutputs(group, outputs, places[u], sums[u]);
    }
  });
}

// ---- host side -------------------------------------------------------------------

constexpr int64_t kAlign = 256;
inline int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Workspace: [head: any_nonfinite, bad_index] [flags: int32 per tensor]
// [reduction partials] [p: float32 per element, sparse codecs] [selection].
struct Workspace {
  int32_t* head;
  int32_t* flags;
  double* partials;
  float* p;
  void* select;
};

struct Checked {
  Codec codec;
  int64_t num_tensors;
  int64_t total;
  int64_t payload_bytes;
  int64_t row_bytes;
  int64_t context_size;
  int64_t max_size;
  randomk_group::Sizes randomk;  // randomk: the draws' workspace
};

// Validates the arguments; false for anything the launchers cannot run.
bool Check(const MergecompGpuCodec* codec, const MergecompGpuGroup* group, Checked* out) {
  if (codec == nullptr || group == nullptr || group->host_offsets == nullptr) return false;
  if (!LookUp(codec->name, &out->codec)) return false;
  if (codec->memory < MERGECOMP_MEMORY_NONE || codec->memory > MERGECOMP_MEMORY_DGC) return false;
  if (codec->marker_bytes != 1 && codec->marker_bytes != 2 && codec->marker_bytes != 4) return false;
  if (group->num_tensors < 0 || group->host_offsets[0] != 0) return false;
  out->num_tensors = group->num_tensors;
  out->max_size = 0;
  for (int64_t t = 0; t < group->num_tensors; ++t) {
    const int64_t size = group->host_offsets[t + 1] - group->host_offsets[t];
    if (size < 0) return false;
    out->max_size = size > out->max_size ? size : out->max_size;
  }
  out->total = group->host_offsets[group->num_tensors];
  const int64_t n = out->total;
  out->context_size = 0;
  out->randomk = randomk_group::Sizes();
  switch (out->codec) {
    case kNone: out->payload_bytes = payload_size::None(n); break;
    case kFp16: out->payload_bytes = payload_size::Fp16(n); break;
    case kSignsgd: out->payload_bytes = payload_size::Signsgd(n); break;
    case kOnebit: out->payload_bytes = payload_size::Onebit(n); break;
    case kEfsignsgd: out->payload_bytes = payload_size::Efsignsgd(n); break;
    case kQsgd:
      if (codec->levels < 1 || codec->levels > (int64_t{1} << 20)) return false;
      out->payload_bytes = payload_size::Qsgd(n, codec->levels);
      break;
    case kTerngrad: out->payload_bytes = payload_size::Terngrad(n); break;
    case kTopk:
    case kDgc:
      if (codec->k < 0 || codec->k > n || n > INT32_MAX) return false;
      if (out->codec == kDgc && codec->k > 0 && codec->sample_size < 1) return false;
      out->payload_bytes = payload_size::Sparse(codec->k);
      break;
    case kRandomk: {
      if (codec->host_tensor_k == nullptr || n > INT32_MAX) return false;
      int64_t slots = 0;
      for (int64_t t = 0; t < group->num_tensors; ++t) {
        const int64_t k = codec->host_tensor_k[t];
        const int64_t size = group->host_offsets[t + 1] - group->host_offsets[t];
        if (k < 0 || k > size) return false;
        slots += k;
      }
      out->context_size = slots;
      out->randomk = randomk_group::SizesFor(group->num_tensors, group->host_offsets,
                                             codec->host_tensor_k);
      out->payload_bytes = payload_size::Randomk(slots);
      break;
    }
  }
  out->row_bytes =
      out->payload_bytes + payload_size::Markers(group->num_tensors, codec->marker_bytes);
  return true;
}

int64_t SelectBytes(const MergecompGpuCodec* codec, const Checked& c) {
  switch (c.codec) {
    case kTopk: return static_cast<int64_t>(mergecomp_topk_workspace_bytes(c.total));
    case kDgc:
      return static_cast<int64_t>(mergecomp_dgc_workspace_bytes(c.total, codec->sample_size));
    case kRandomk: return c.randomk.Bytes(c.num_tensors);
    default: return 0;
  }
}

int64_t WorkspaceBytes(const MergecompGpuCodec* codec, const Checked& c) {
  return kAlign + Aligned(4 * c.num_tensors) + Aligned(gpu::kScratchBytes) +
         (IsSparse(c.codec) ? Aligned(4 * c.total) : 0) + Aligned(SelectBytes(codec, c));
}

Workspace Carve(void* base, const Checked& c) {
  char* p = static_cast<char*>(base);
  Workspace ws;
  ws.head = reinterpret_cast<int32_t*>(p);
  p += kAlign;
  ws.flags = reinterpret_cast<int32_t*>(p);
  p += Aligned(4 * c.num_tensors);
  ws.partials = reinterpret_cast<double*>(p);
  p += Aligned(gpu::kScratchBytes);
  ws.p = reinterpret_cast<float*>(p);
  if (IsSparse(c.codec)) p += Aligned(4 * c.total);
  ws.select = p;
  return ws;
}

DeviceGroup MakeDeviceGroup(const MergecompGpuGroup* group, const Checked& c) {
  return DeviceGroup{c.num_tensors, c.total, group->offsets};
}

#define MERGECOMP_RETURN_IF_ERROR(expr)         \
  do {                                          \
    const int error_ = static_cast<int>(expr);  \
    if (error_ != 0) return error_;             \
  } while (0)

template <Codec kCodec>
int EncodeDense(const MergecompGpuCodec* codec, const Checked& c, DeviceGroup group,
                DeviceMemory memory, const Workspace& ws, int64_t seed, uint8_t* row,
                cudaStream_t stream) {
  constexpr bool kReduces =
      kCodec == kOnebit || kCodec == kEfsignsgd || kCodec == kQsgd || kCodec == kTerngrad;
  // The first pass over the gradients finds the non-finite tensors: the
  // reduction; else the codes themselves when there is no state to write;
  // else a pass of its own.
  int codes_mode = kFlagsKnown;
  if (kReduces) {
    // Launched also for an empty group: the header is written either way.
    const int grid = gpu::ReduceTileGridFor(c.total);
    ReduceKernel<kCodec><<<grid, kThreads, 0, stream>>>(group, memory, ws.partials, kFindFlags);
    ReduceKernel<kCodec><<<grid, kThreads, 0, stream>>>(group, memory, ws.partials, kRedoIfFound);
    HeaderKernel<kCodec><<<1, kThreads, 0, stream>>>(ws.partials, grid, c.total, row);
    MERGECOMP_RETURN_IF_ERROR(cudaGetLastError());
  } else if (memory.kind == MERGECOMP_MEMORY_NONE) {
    codes_mode = kFindFlags;
  } else {
    MERGECOMP_RETURN_IF_ERROR(gpu::LaunchTiles(c.total, stream, NonFiniteKernel, group, memory));
  }
  const CodeParams params{MakeSeedKey(seed), codec->levels,
                          kCodec == kQsgd ? QsgdCodeBits(codec->levels) : 0};
  const int64_t code_bytes = c.payload_bytes - CodesHeaderBytes<kCodec>();
  MERGECOMP_RETURN_IF_ERROR(gpu::LaunchTiles(c.total, stream, CodesKernel<kCodec>, group, memory,
                                             params, row, code_bytes, codes_mode));
  if (codes_mode != kFindFlags) return 0;
  return gpu::LaunchTiles(c.total, stream, CodesKernel<kCodec>, group, memory, params, row,
                          code_bytes, static_cast<int>(kRedoIfFound));
}

int EncodeSparse(const MergecompGpuCodec* codec, const MergecompGpuGroup* host_group,
                 const Checked& c, DeviceGroup group, DeviceMemory memory, const Workspace& ws,
                 int64_t seed, uint8_t* row, int32_t* codec_context, cudaStream_t stream) {
  MERGECOMP_RETURN_IF_ERROR(gpu::LaunchTiles(c.total, stream, NonFiniteKernel, group, memory));
  MERGECOMP_RETURN_IF_ERROR(gpu::LaunchTiles(c.total, stream, CompensateKernel, group, memory, ws.p));
  const float* values = reinterpret_cast<const float*>(row);
  int64_t slots = 0;
  const int32_t* indices = nullptr;
  if (c.codec == kTopk) {
    MERGECOMP_RETURN_IF_ERROR(
        mergecomp_topk_encode_gpu(ws.p, c.total, codec->k, row, ws.select, stream));
    slots = codec->k;
    indices = reinterpret_cast<const int32_t*>(row + 4 * slots);
  } else if (c.codec == kDgc) {
    MERGECOMP_RETURN_IF_ERROR(mergecomp_dgc_encode_gpu(ws.p, c.total, seed, codec->k,
                                                          codec->sample_size, row, ws.select,
                                                          stream));
    slots = codec->k;
    indices = reinterpret_cast<const int32_t*>(row + 4 * slots);
  } else {
    // Every tensor's draw (k_i of n_i, seed TensorSeed(seed, i)), as the CPU
    // draws (randomk_group_select_gpu.cu.h).
    const randomk_group::Group draws{c.num_tensors, group.offsets, codec->tensor_k, seed};
    MERGECOMP_RETURN_IF_ERROR(randomk_group::LaunchSelect(draws, c.randomk, ws.select, ws.p,
                                                          reinterpret_cast<float*>(row),
                                                          codec_context, stream));
    slots = c.context_size;
    indices = codec_context;
  }
  if (memory.kind != MERGECOMP_MEMORY_RESIDUAL && memory.kind != MERGECOMP_MEMORY_DGC) return 0;
  return gpu::LaunchOver(slots, stream, CorrectSentKernel, group, memory, slots, values, indices,
                         c.codec == kRandomk ? codec->tensor_k : nullptr, codec->scale);
}

template <Codec kCodec>
int DecodeDense(const MergecompGpuCodec* codec, const Checked& c, DeviceGroup group,
                float* const* outputs, const uint8_t* rows, int64_t num_rows,
                const int32_t* nonfinite, cudaStream_t stream) {
  const int bits = kCodec == kQsgd ? QsgdCodeBits(codec->levels) : 0;
  return gpu::LaunchOver(c.total, stream, DenseDecodeKernel<kCodec>, group, outputs, rows,
                         num_rows, c.row_bytes, codec->levels, bits, nonfinite);
}

// Waits for the stream and reports a bad index found by the scatter kernels.
int BadIndexResult(const int32_t* bad_index, cudaStream_t stream) {
  int32_t found = 0;
  MERGECOMP_RETURN_IF_ERROR(
      cudaMemcpyAsync(&found, bad_index, sizeof(found), cudaMemcpyDeviceToHost, stream));
  MERGECOMP_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return found ? MERGECOMP_GPU_BAD_INDEX : 0;
}

int DecodeSparse(const MergecompGpuCodec* codec, const Checked& c, DeviceGroup group,
                 float* const* outputs, const uint8_t* rows, int64_t num_rows,
                 const int32_t* codec_context, const int32_t* nonfinite, const Workspace& ws,
                 bool report_bad_index, cudaStream_t stream) {
  int32_t* bad_index = ws.head + 1;
  MERGECOMP_RETURN_IF_ERROR(cudaMemsetAsync(bad_index, 0, sizeof(int32_t), stream));
  MERGECOMP_RETURN_IF_ERROR(
      gpu::LaunchTiles(c.total, stream, FillKernel, group, outputs, nonfinite));
  if (c.codec == kRandomk) {
    // The averaged row of an allreduce: values at this group's own positions.
    MERGECOMP_RETURN_IF_ERROR(gpu::LaunchOver(
        c.context_size, stream, ScatterAssignKernel, group, outputs,
        reinterpret_cast<const float*>(rows), codec_context, c.context_size, codec->tensor_k,
        codec->scale, nonfinite, bad_index));
  } else {
    // One launch per row: rows add in worker order, as on the CPU.
    for (int64_t w = 0; w < num_rows; ++w) {
      MERGECOMP_RETURN_IF_ERROR(gpu::LaunchOver(codec->k, stream, ScatterAddKernel, group,
                                                outputs, rows + w * c.row_bytes, codec->k,
                                                nonfinite, bad_index));
    }
    if (num_rows > 1) {
      MERGECOMP_RETURN_IF_ERROR(
          gpu::LaunchTiles(c.total, stream, DivideKernel, group, outputs, num_rows, nonfinite));
    }
  }
  return report_bad_index ? BadIndexResult(bad_index, stream) : 0;
}

// The codec's payload (the markers come after, once its first pass found the
// non-finite tensors).
int EncodePayload(const MergecompGpuCodec* codec, const MergecompGpuGroup* group,
                  const Checked& c, DeviceGroup device_group, const DeviceMemory& memory,
                  const Workspace& ws, int64_t seed, uint8_t* row, int32_t* codec_context,
                  cudaStream_t stream) {
  switch (c.codec) {
    case kNone: return EncodeDense<kNone>(codec, c, device_group, memory, ws, seed, row, stream);
    case kFp16: return EncodeDense<kFp16>(codec, c, device_group, memory, ws, seed, row, stream);
    case kSignsgd:
      return EncodeDense<kSignsgd>(codec, c, device_group, memory, ws, seed, row, stream);
    case kOnebit:
      return EncodeDense<kOnebit>(codec, c, device_group, memory, ws, seed, row, stream);
    case kEfsignsgd:
      return EncodeDense<kEfsignsgd>(codec, c, device_group, memory, ws, seed, row, stream);
    case kQsgd: return EncodeDense<kQsgd>(codec, c, device_group, memory, ws, seed, row, stream);
    case kTerngrad:
      return EncodeDense<kTerngrad>(codec, c, device_group, memory, ws, seed, row, stream);
    default:
      return EncodeSparse(codec, group, c, device_group, memory, ws, seed, row, codec_context,
                          stream);
  }
}

}  // namespace group_gpu
}  // namespace tf_mergecomp

using namespace tf_mergecomp::group_gpu;  // NOLINT: the C entry points below
namespace gpu = tf_mergecomp::gpu;

extern "C" int64_t mergecomp_group_payload_bytes(const MergecompGpuCodec* codec,
                                                 const MergecompGpuGroup* group) {
  Checked c;
  return Check(codec, group, &c) ? c.payload_bytes : -1;
}

extern "C" int64_t mergecomp_group_row_bytes(const MergecompGpuCodec* codec,
                                             const MergecompGpuGroup* group) {
  Checked c;
  return Check(codec, group, &c) ? c.row_bytes : -1;
}

extern "C" int64_t mergecomp_group_context_size(const MergecompGpuCodec* codec,
                                                const MergecompGpuGroup* group) {
  Checked c;
  return Check(codec, group, &c) ? c.context_size : -1;
}

extern "C" int64_t mergecomp_group_workspace_bytes(const MergecompGpuCodec* codec,
                                                   const MergecompGpuGroup* group) {
  Checked c;
  return Check(codec, group, &c) ? WorkspaceBytes(codec, c) : -1;
}

extern "C" int mergecomp_group_encode_gpu(const MergecompGpuCodec* codec,
                                          const MergecompGpuGroup* group, int64_t seed,
                                          uint8_t* row, int32_t* codec_context, void* workspace,
                                          void* stream_ptr) {
  Checked c;
  if (!Check(codec, group, &c)) return MERGECOMP_GPU_BAD_ARGUMENT;
  if (codec->memory != MERGECOMP_MEMORY_NONE && c.num_tensors > 0 && group->state == nullptr) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  if (c.codec == kRandomk && c.num_tensors > 0 && codec->tensor_k == nullptr) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Workspace ws = Carve(workspace, c);
  MERGECOMP_RETURN_IF_ERROR(cudaMemsetAsync(ws.head, 0, kAlign + Aligned(4 * c.num_tensors), stream));
  const DeviceGroup device_group = MakeDeviceGroup(group, c);
  const DeviceMemory memory{codec->memory, codec->decay, codec->gradient_scale, group->inputs,
                            group->state,  ws.flags,     ws.head};
  MERGECOMP_RETURN_IF_ERROR(EncodePayload(codec, group, c, device_group, memory, ws, seed, row,
                                          codec_context, stream));
  // The markers, once the codec's first pass has found the non-finite tensors.
  return gpu::LaunchOver(c.num_tensors, stream, MarkersKernel, c.num_tensors,
                         static_cast<const int32_t*>(ws.flags),
                         static_cast<int>(codec->marker_bytes), row + c.payload_bytes);
}

namespace {
int Decode(const MergecompGpuCodec* codec, const MergecompGpuGroup* group, const uint8_t* rows,
           int64_t num_rows, const int32_t* codec_context, int32_t* nonfinite, void* workspace,
           void* stream_ptr, bool report_bad_index) {
  Checked c;
  if (!Check(codec, group, &c) || num_rows < 1) return MERGECOMP_GPU_BAD_ARGUMENT;
  if (c.codec == kRandomk && c.num_tensors > 0 && codec->tensor_k == nullptr) {
    return MERGECOMP_GPU_BAD_ARGUMENT;
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const Workspace ws = Carve(workspace, c);
  const DeviceGroup device_group = MakeDeviceGroup(group, c);
  MERGECOMP_RETURN_IF_ERROR(gpu::LaunchOver(c.num_tensors, stream, FlagsFromMarkersKernel,
                                            c.num_tensors, rows, num_rows, c.row_bytes,
                                            c.payload_bytes,
                                            static_cast<int>(codec->marker_bytes), nonfinite));
  const int32_t* flags = nonfinite;
  float* const* outputs = group->outputs;
  switch (c.codec) {
    case kNone:
      return DecodeDense<kNone>(codec, c, device_group, outputs, rows, num_rows, flags, stream);
    case kFp16:
      return DecodeDense<kFp16>(codec, c, device_group, outputs, rows, num_rows, flags, stream);
    case kSignsgd:
      return DecodeDense<kSignsgd>(codec, c, device_group, outputs, rows, num_rows, flags, stream);
    case kOnebit:
      return DecodeDense<kOnebit>(codec, c, device_group, outputs, rows, num_rows, flags, stream);
    case kEfsignsgd:
      return DecodeDense<kEfsignsgd>(codec, c, device_group, outputs, rows, num_rows, flags,
                                     stream);
    case kQsgd:
      return DecodeDense<kQsgd>(codec, c, device_group, outputs, rows, num_rows, flags, stream);
    case kTerngrad:
      return DecodeDense<kTerngrad>(codec, c, device_group, outputs, rows, num_rows, flags,
                                    stream);
    default:
      return DecodeSparse(codec, c, device_group, outputs, rows, num_rows, codec_context, flags,
                          ws, report_bad_index, stream);
  }
}
}  // namespace

extern "C" int mergecomp_group_decode_gpu(const MergecompGpuCodec* codec,
                                          const MergecompGpuGroup* group, const uint8_t* rows,
                                          int64_t num_rows, const int32_t* codec_context,
                                          int32_t* nonfinite, void* workspace,
                                          void* stream_ptr) {
  return Decode(codec, group, rows, num_rows, codec_context, nonfinite, workspace, stream_ptr,
                /*report_bad_index=*/true);
}

extern "C" int mergecomp_group_decode_gpu_async(const MergecompGpuCodec* codec,
                                                const MergecompGpuGroup* group,
                                                const uint8_t* rows, int64_t num_rows,
                                                const int32_t* codec_context, int32_t* nonfinite,
                                                void* workspace, void* stream_ptr) {
  return Decode(codec, group, rows, num_rows, codec_context, nonfinite, workspace, stream_ptr,
                /*report_bad_index=*/false);
}

extern "C" const char* mergecomp_group_error_string(int code) {
  if (code == MERGECOMP_GPU_BAD_INDEX) {
    return "a sparse payload holds an index outside the group";
  }
  if (code == MERGECOMP_GPU_BAD_ARGUMENT) {
    return "bad arguments (unknown codec or memory, k or levels out of range, missing tables); "
           "codecs: none, fp16, signsgd, onebit, efsignsgd, qsgd, terngrad, topk, dgc, randomk";
  }
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

extern "C" const char* mergecomp_group_codec_names(void) {
  return "none,fp16,signsgd,onebit,efsignsgd,qsgd,terngrad,topk,dgc,randomk";
}
