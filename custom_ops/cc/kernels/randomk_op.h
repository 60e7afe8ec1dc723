// Random-k index selection, as the random-k group codec (randomk_op.cc) and
// its CUDA launchers (randomk_op_gpu.cu.cc, group_op_gpu.cu.cc) draw.
//
// Every position i gets the random key RandomBits(seed, i); the k positions
// with the largest keys (ties to the lower index) are chosen, returned in
// ascending order. That is a uniformly random k-subset, without replacement,
// and a pure function of (seed, n, k): the same on every worker, device and
// thread count, and reproducible in plain TensorFlow (tf.math.top_k on the
// keys).
#ifndef TF_MERGECOMP_RANDOMK_OP_H_
#define TF_MERGECOMP_RANDOMK_OP_H_

#endif  // TF_MERGECOMP_RANDOMK_OP_H_
