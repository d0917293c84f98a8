"""One-line fault tolerance for framework training loops, on the `regatta` SDK.

    from regatta.integrations.huggingface import RegattaCallback   # transformers
    from regatta.integrations.lightning import RegattaCallback     # lightning

Each module imports its framework when it is imported; this package imports
nothing (``import regatta`` works without either framework). docs/byo.md
describes them.
"""
