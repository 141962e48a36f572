"""The package SGLang reads model classes from: ``SGLANG_EXTERNAL_MODEL_PACKAGE=probmoe.integrations.sglang.models``.

SGLang's registry imports every module here and takes its ``EntryClass`` (``families``: one
class per family of ``probmoe.integrations.sglang.FAMILIES``). Importing a module here imports sglang.
"""
