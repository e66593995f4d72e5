"""asd-jax: approximate speculative decoding (ASD) and the rules and loops around it.

The curated public surface; everything else is an implementation module.
"""

from asd_jax.asd_config import EXPLORATORY, PAPER, STRICT, ASDConfig
from asd_jax.asd_verify import asd_verify, asd_verify_traced
from asd_jax.calibrate import calibrate_asd, first_rejection_ratios
from asd_jax.decode_stats import DecodeStats
from asd_jax.draft_tree import TreeDrafter, TreeShape, lm_tree_drafter
from asd_jax.drafter_api import ChainDrafter, lm_chain_drafter
from asd_jax.greedy_verify import greedy_verify
from asd_jax.lm_api import LanguageModelFns
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.plain_decode import DecodeResult, plain_decode
from asd_jax.prompt_logprobs import PromptLogprobs, prompt_logprobs
from asd_jax.sampling import SamplingConfig
from asd_jax.decode_rounds import SpecDecodeResult
from asd_jax.spec_decode import asd_decode
from asd_jax.spec_sampling import (apply_sampling_filters, speculative_sample,
                                   tree_speculative_sample)
from asd_jax.stop_strings import StopStrings
from asd_jax.token_guide import TokenGuide
from asd_jax.token_stream import TokenStream
from asd_jax.tree_decode import asd_tree_decode
from asd_jax.tree_verify import tree_asd_verify, tree_greedy_verify
from asd_jax.typical_acceptance import typical_verify
from asd_jax.verify_output import NONFINITE_TOKEN, TreeVerifyOutput, VerifyOutput

__all__ = [
    "ASDConfig", "PAPER", "EXPLORATORY", "STRICT",
    "asd_verify", "asd_verify_traced", "greedy_verify", "typical_verify",
    "tree_greedy_verify", "tree_asd_verify",
    "speculative_sample", "tree_speculative_sample", "apply_sampling_filters",
    "VerifyOutput", "TreeVerifyOutput", "NONFINITE_TOKEN",
    "calibrate_asd", "first_rejection_ratios",
    "LanguageModelFns", "ChainDrafter", "lm_chain_drafter", "ngram_drafter", "SamplingConfig",
    "plain_decode", "DecodeResult", "asd_decode", "asd_tree_decode", "SpecDecodeResult",
    "TreeShape", "TreeDrafter", "lm_tree_drafter",
    "DecodeStats", "TokenStream", "StopStrings", "prompt_logprobs", "PromptLogprobs",
    "TokenGuide",
]
