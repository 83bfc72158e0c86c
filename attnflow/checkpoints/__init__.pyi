"""The public names of `attnflow.checkpoints`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

from ._canonical import Attention as Attention
from ._canonical import Blocks as Blocks
from ._canonical import Checkpoint as Checkpoint
from ._canonical import FeedForward as FeedForward
from ._flow import (
    DepthFlow as DepthFlow,
)
from ._flow import (
    Forward as Forward,
)
from ._flow import (
    depth_flow as depth_flow,
)
from ._flow import (
    forward as forward,
)
from ._flow import (
    run_depth as run_depth,
)
from ._flow import (
    teacher_forced as teacher_forced,
)
from ._flow import (
    with_source as with_source,
)
from ._load import load_checkpoint as load_checkpoint
from ._load import load_tokenizer as load_tokenizer
from ._locate import installed_model as installed_model
from ._tokenizer import Tokenizer as Tokenizer
from .native import save_checkpoint as save_checkpoint
from .probes import (
    decode_head_vectors as decode_head_vectors,
)
from .probes import (
    embedding_distances as embedding_distances,
)
from .probes import (
    normalized_embeddings as normalized_embeddings,
)
from .probes import (
    token_path as token_path,
)
from .spectra import draw_spectra as draw_spectra
from .spectra import head_spectra as head_spectra

__all__ = [
    "Attention",
    "Blocks",
    "Checkpoint",
    "DepthFlow",
    "FeedForward",
    "Forward",
    "Tokenizer",
    "decode_head_vectors",
    "depth_flow",
    "draw_spectra",
    "embedding_distances",
    "forward",
    "head_spectra",
    "installed_model",
    "load_checkpoint",
    "load_tokenizer",
    "normalized_embeddings",
    "run_depth",
    "save_checkpoint",
    "teacher_forced",
    "token_path",
    "with_source",
]
