# python first_gradient.py OUT.npz WORKDIR/tokenizer.model  (from the repository root)
import sys, tempfile, shutil, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, ".")
from configs import scalerl
from scalerl_jax import experiment
from scalerl_jax.models import lm_head
c = scalerl.get_config(); c.trainer.warm_start_steps = 0
wd = tempfile.mkdtemp(); shutil.copy(sys.argv[2], wd)
e = experiment.Experiment.build(c, wd)
rng = np.random.RandomState(0)
tokens = jnp.asarray(rng.randint(3, 500, size=(64, 96)), jnp.int32)
def loss_fn(p):
  logits = e.model.apply({"params": p}, tokens[:, :-1])
  return -jnp.mean(lm_head.token_logprobs(logits, tokens[:, 1:]))
loss, g = jax.jit(jax.value_and_grad(loss_fn))(e.params)
flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(g)}
flat["loss"] = np.asarray(loss)
np.savez(sys.argv[1], **flat)
print(jax.__version__, float(loss))
