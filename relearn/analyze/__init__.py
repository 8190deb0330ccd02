"""The analyses of the ROSS paper's section 2, over pools of trajectories.

  pools   named pools on the command line (``NAME=PATH``), read with line numbers
  nll     compatibility: token-level NLL of each pool's eligible tokens under a model
  passk   complementarity: per-problem success rates, unbiased pass@k curves, problems
          solved by one pool and not another
  plots   the PNGs of both

torch and transformers are imported inside ``nll`` only, so ``passk`` stays cheap.
"""
