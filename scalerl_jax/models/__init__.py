"""The policy network, its attention implementations and its KV-cache path.

The attention implementations register with `attention` when imported (the
kernels in modules of their own, `plain` beside its math in transformer), so
they are imported here, where the package is assembled: any import of the
package registers them all, and `attention` never imports them back.
"""

from scalerl_jax.models import blockwise_attention  # noqa: F401
from scalerl_jax.models import splash_attention  # noqa: F401
from scalerl_jax.models import transformer  # noqa: F401
