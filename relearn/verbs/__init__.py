"""What each verb accepts: its options, each declared once (``relearn.options``), one module per
verb or group of verbs.

`relearn VERB`'s flags and help page (``relearn.cli.declared``) and the pipeline file's tables
(``relearn.pipeline.tables``) are derived from these classes; the work each verb does is in
``relearn.ops``, which takes them as its input. These modules declare and do nothing else: they
import no operation, so the pipeline file is checked without the work (an import-linter
contract). The trainer's options are ``relearn.train.options``, beside the trainer's own checks.
"""
