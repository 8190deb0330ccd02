"""Compiled masks for the trainers teams already run (TRL, axolotl, verl, LLaMA-Factory, plain
``datasets``), and the A \\ E spans themselves for any other."""
