"""The policy network, its attention kernels and its KV-cache path.

The built-in attention kernels register with `attention` when imported, so
they are imported here, where the package is assembled: any import of the
package registers them, and `attention` never imports them back.
"""

from scalerl_jax.models import blockwise_attention  # noqa: F401
from scalerl_jax.models import splash_attention  # noqa: F401
