from aldebaran.cli import main

raise SystemExit(main(["declare"]))
