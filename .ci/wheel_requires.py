"""Prints the run-time requirements a wheel declares (its METADATA's Requires-Dist without
extras), less the ones named after --except: what `.ci/run` installs before its smoke test."""

import argparse
import re
import zipfile
from email.parser import BytesParser

parser = argparse.ArgumentParser()
parser.add_argument("wheel")
parser.add_argument("--except", dest="skip", nargs="*", default=[])
args = parser.parse_args()
with zipfile.ZipFile(args.wheel) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = BytesParser().parsebytes(wheel.read(name))
for requirement in metadata.get_all("Requires-Dist") or []:
    spec, _, marker = requirement.partition(";")
    project = re.match(r"\s*([A-Za-z0-9._-]+)", spec).group(1)  # a PEP 508 name leads the requirement
    if "extra ==" not in marker and project.lower() not in {s.lower() for s in args.skip}:
        print(spec.replace(" ", ""))
