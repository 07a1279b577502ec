"""The tools around the runtime: the ``opruntime`` command (:mod:`.cli`), the benchmark
(:mod:`.bench`), its peers (:mod:`.peers`), its charts (:mod:`.plot`), the command's tables and
strict JSON (:mod:`.output`) and progress on stderr (:mod:`.progress`).

They use the runtime; the runtime never imports them (``import opruntime`` loads none of this
package). Everything they know about an operator they read from the operator
(``opruntime.ops.OPS``), and every timing goes through :mod:`opruntime.timing`.
"""
