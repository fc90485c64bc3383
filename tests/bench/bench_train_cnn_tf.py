"""bench_train_cnn_tf.py -- TensorFlow side of bench_train_cnn.lua (and of its
PyTorch twin bench_train_cnn.py): training samples/s and peak RSS of the
Fashion-MNIST CNN (conv 3x3 32 - ReLU - maxpool 2 - conv 3x3 64 - ReLU -
maxpool 2 - linear 3136-128 - ReLU - linear 128-10) in Keras, Adam 1e-3, batch
128, cross-entropy, on the same first 40 batches of the train set, 5 warm-up steps
then 30 timed steps; 2 intra-op threads, 1 inter-op thread. Printed as train_cnn
(samples/s) and rss_cnn (MB), as the other sides.

The step is a custom training loop: one tf.function (forward, GradientTape
backward, Adam update) called once per batch from Python, as ember and PyTorch
call one step per batch; model.fit would add Keras's callback and data-adapter
machinery per step and, with steps_per_execution, run several steps per call,
which the other sides do not. No XLA (jit_compile off, TensorFlow's default).

Differences from the ember side that could not be removed:
- the step is a traced graph (tf.function), not eager ops: TensorFlow's usual
  way to train; eager TensorFlow would be much slower and nobody trains so;
- channels-last (NHWC) images and activations, not NCHW: TensorFlow's CPU
  kernels want NHWC (its Conv2D on CPU does not take NCHW); the same arithmetic,
  and Flatten sees the 3136 values in another order;
- Keras's Adam puts eps inside the bias correction (lr_t * m / (sqrt(v) + eps))
  where ember and PyTorch use m_hat / (sqrt(v_hat) + eps): the same step up to
  eps's scale;
- the weights are drawn from the same distributions (PyTorch's default init) but
  by TensorFlow's generator, so the numbers differ;
- TensorFlow's graph optimizer (grappler) and oneDNN may fuse ops (conv + bias +
  ReLU) that ember runs one by one: that is part of what is measured;
- peak RSS includes TensorFlow's own runtime (a much larger library than ember).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_common import run_train  # noqa: E402

run_train('cnn', 30)
