"""``relearn envs``: the task images and the engine they run on, one module per verb's operation.

Each verb's module holds its options dataclass (its docstring is the verb's help, its declared
options the verb's flags), its summary and its ``run_*``: ``build_base`` (``relearn envs
build-base``), ``build`` (``build``), ``audit`` (``audit``: images whose .git exposes the fix),
``audit_verdicts`` (``audit --verdicts``: what the verifier did beyond grading), ``gc`` (orphaned
containers, here or on every node of a cluster), ``load`` (image tarballs), ``check_image`` (the
image contract), ``build_swebench`` (SWE-bench instance images built offline) and
``fetch_wheels`` (the wheelhouse build-swebench installs from). Shared by several:
``_engine`` (refusing a cluster address or registry, a failed base-image build) and ``_swebench``
(the SWE-bench rows' install recipes and their source checkout). Those that start containers do it
through ``relearn.ops.containers``: the engine with last run's orphans swept, images routed by the
image map or template, the containers' limits, SIGTERM unwinding like Ctrl-C.
"""
