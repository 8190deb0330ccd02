"""The operations: one function per verb, which both front-ends call.

`relearn VERB` turns its flags into the verb's options object and renders the summary it gets
back; `relearn run` turns its pipeline file into the same options object. Whatever every caller
must do (open and close the Ray backend, sweep orphaned containers, choose and prepare images,
keep the call cache and ledger) happens here, once.

Each module holds, for one verb (its ``XOptions`` are declared in ``relearn.verbs``):

    XSummary    what the run did, typed, for the front-end to render
    run_x(options, reporter=SILENT) -> XSummary

Problems with the input or the usage raise ``OpError`` (the front-ends exit 2 with its one-line
message); progress goes through a ``Reporter`` (``relearn.ops.reporting``).
"""
