"""Fixtures of the core tests: transformers and the Hugging Face Hub, offline and out of the user's caches."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory):
    """transformers copies an export's modeling files into its modules cache (a package it imports
    once per process, so one cache serves the whole session) and huggingface_hub reads its Hub
    cache: keep both under a temporary folder, offline. The paths are read when the libraries are
    imported, so the already imported modules' constants are patched as well."""
    root = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(root))
        patch.setenv("HF_HUB_CACHE", str(root / "hub"))
        patch.setenv("HF_MODULES_CACHE", str(root / "modules"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        import huggingface_hub.constants as hub_constants
        import transformers.dynamic_module_utils as dynamic

        patch.setattr(dynamic, "HF_MODULES_CACHE", str(root / "modules"))
        patch.setattr(hub_constants, "HF_HUB_CACHE", str(root / "hub"))
        patch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
        yield root
