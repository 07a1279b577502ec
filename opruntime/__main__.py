"""``python -m opruntime``: the ``opruntime`` command (:mod:`opruntime.tools.cli`).

The runtime never imports the tools (``tests/system/test_layers.py``): ``import opruntime``
never loads this module, which Python runs only for ``python -m opruntime``, and the import of
the command sits under the ``__main__`` guard, so even importing this module by name loads no
tool. The layer test counts this module as the command's entry point, with the tools (layer 7).
"""

if __name__ == "__main__":
    import sys

    from opruntime.tools.cli import main

    sys.exit(main())
