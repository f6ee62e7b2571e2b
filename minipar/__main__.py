"""``python -m minipar ...`` (also under ``mpiexec -n N python -m mpi4py -m minipar ...``)."""
import sys

from minipar.cli import main

sys.exit(main())
