"""Hugging Face transformers as the scripts and tests import it: `from scripts.hf import transformers`.

transformers 5 imports Hugging Face's package `kernels` where it is installed, a name this project's kernels/
takes wherever the repository root is on the import path. Nothing here wants its hub kernels (GPU code it
downloads), so transformers is told the package is absent before any of its modules asks.
"""
import transformers
import transformers.utils.import_utils

for module in (transformers.utils, transformers.utils.import_utils):  # its modules import it from either
    module.is_kernels_available = lambda *args, **kwargs: False
