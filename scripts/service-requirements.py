"""The requirements of the service's image, one a line: the project's dependencies and its
`service` extra, read from pyproject.toml (the one list of them). The host's wheel folder
(scripts/build-service-image.sh) and the Dockerfile's dependency layer both come from it.
With --build, also what building the project's own wheel needs ([build-system] requires).
Usage: python3 scripts/service-requirements.py [--build] [PYPROJECT]"""

import sys
import tomllib
from pathlib import Path

args = sys.argv[1:]
build = "--build" in args
args = [a for a in args if a != "--build"]
path = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "pyproject.toml"
document = tomllib.loads(path.read_text())
project = document["project"]
wanted = [*project["dependencies"], *project["optional-dependencies"]["service"]]
if build:
    wanted += document["build-system"]["requires"]
print("\n".join(wanted))
