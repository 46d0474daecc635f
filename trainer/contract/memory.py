"""Memory rules the platform sizes with before the trainer runs (job preflight, the file system's
checkpoint time). Torch-free."""
from __future__ import annotations

# Bytes of training state per parameter with AdamW and fp32 parameters (bf16 autocast keeps the
# weights in fp32): weights 4 + gradients 4 + AdamW's two moments 4 + 4 (the ZeRO paper's
# accounting, Rajbhandari et al. 2020, section 3.1, without the fp16 copy). Activations come on
# top. An extra copy of the weights (an EMA) or another optimizer changes it here, once.
TRAINING_STATE_BYTES_PER_PARAMETER = 16
