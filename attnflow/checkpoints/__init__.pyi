"""The public names of `attnflow.checkpoints`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

from ._canonical import Attention as Attention, Blocks as Blocks, Checkpoint as Checkpoint, FeedForward as FeedForward
from ._flow import (
    depth_flow as depth_flow,
    DepthFlow as DepthFlow,
    Forward as Forward,
    forward as forward,
    run_depth as run_depth,
)
from ._load import load_checkpoint as load_checkpoint, load_tokenizer as load_tokenizer
from ._locate import installed_model as installed_model
from ._tokenizer import Tokenizer as Tokenizer
from .native import save_checkpoint as save_checkpoint
from .probes import (
    decode_head_vectors as decode_head_vectors,
    embedding_distances as embedding_distances,
    normalized_embeddings as normalized_embeddings,
    token_path as token_path,
)
from .spectra import draw_spectra as draw_spectra, head_spectra as head_spectra

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
    "token_path",
]
