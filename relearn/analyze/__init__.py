"""``relearn analyze``: the analyses of the ROSS paper's section 2, which compare named pools
with each other, or under a model (``relearn stats`` only counts what one pool family holds).

  pools   named pools on the command line (``NAME=PATH``)
  nll     compatibility: token-level NLL of each pool's eligible tokens under a model
  passk   complementarity: per-problem success rates, unbiased pass@k curves, problems
          solved by one pool and not another
  plots   the PNGs of both
  tables  the terminal's tables of both

torch and transformers are imported inside ``nll`` only, so ``passk`` stays cheap.
"""
