"""The runner guard's sources, written into the test container (see ``envs.runner_guard``): a
package only so that they install with ``envs``; nothing here is imported by the verifier."""
