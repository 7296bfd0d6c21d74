"""python -m gpuaccel [doctor | bench | demo] ...

  doctor   what this machine has for GPU training, what is inconsistent, and the fix
  bench    gpuaccel against torch, side by side (bandwidths, matmul, fused layers, loader, logger)
  demo     train one CNN the gpuaccel way and the usual way, side by side

Without a command: a one-screen summary (the doctor's facts).
"""

import sys

COMMANDS = ("doctor", "bench", "demo")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else None
    if command == "doctor":
        from . import doctor

        return doctor.main(argv)
    if command == "bench":
        from . import bench

        return bench.main(argv)
    if command == "demo":
        from . import demo

        return demo.main(argv)
    if command is None and not argv:
        from . import doctor

        facts = doctor.collect()
        print(doctor.report(facts, doctor.diagnose(facts)))
        print("\n(python -m gpuaccel doctor | bench | demo --help)")
        return 0
    if command is not None:
        from ._cli import nearest

        guess = nearest(command, COMMANDS)
        print("python -m gpuaccel: unknown command %r%s\n" % (command, "; did you mean %r?" % guess if guess else ""),
              file=sys.stderr)
    print(__doc__.strip(), file=sys.stderr if command or argv not in (["-h"], ["--help"]) else sys.stdout)
    return 0 if command is None and argv in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main())
