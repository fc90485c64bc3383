"""bench_train_mlp_tf.py -- TensorFlow side of bench_train_mlp.lua (and of its
PyTorch twin bench_train_mlp.py): training samples/s and peak RSS of the
Fashion-MNIST MLP (784-512-256-10, ReLU) in Keras, Adam 1e-3, batch 128,
cross-entropy, on the same first 40 batches of the train set, 5 warm-up steps
then 100 timed steps; 2 intra-op threads, 1 inter-op thread. Printed as
train_mlp (samples/s) and rss_mlp (MB), as the other sides.

The step is a custom training loop: one tf.function (forward, GradientTape
backward, Adam update) called once per batch from Python, as ember and PyTorch
call one step per batch; model.fit would add Keras's callback and data-adapter
machinery per step and, with steps_per_execution, run several steps per call,
which the other sides do not. No XLA (jit_compile off, TensorFlow's default).

Differences from the ember side that could not be removed:
- the step is a traced graph (tf.function), not eager ops: TensorFlow's usual
  way to train; eager TensorFlow would be much slower and nobody trains so;
- Keras's Adam puts eps inside the bias correction (lr_t * m / (sqrt(v) + eps))
  where ember and PyTorch use m_hat / (sqrt(v_hat) + eps): the same step up to
  eps's scale;
- the weights are drawn from the same distributions (PyTorch's default init) but
  by TensorFlow's generator, so the numbers differ;
- images are 28 x 28 x 1 (NHWC) before Flatten, not 1 x 28 x 28: the same 784
  values per sample;
- peak RSS includes TensorFlow's own runtime (a much larger library than ember).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_common import run_train  # noqa: E402

run_train('mlp', 100)
