"""Validates JSON documents against a schema of schemas/ (python3-jsonschema). Each document may be a
file, or '-' followed by a command whose standard output is the document (its exit code is ignored:
reports with problems are still reports)."""
import json
import subprocess
import sys

import jsonschema

schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
docs, args = [], sys.argv[2:]
failed = 0
i = 0
while i < len(args):
    if args[i] == "--cmd":
        out = subprocess.run(args[i + 1].split(), capture_output=True, text=True).stdout
        docs.append((args[i + 1], json.loads(out)))
        i += 2
    else:
        docs.append((args[i], json.load(open(args[i]))))
        i += 1
for name, doc in docs:
    errors = list(validator.iter_errors(doc))
    for e in errors[:5]:
        print(f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
    failed += bool(errors)
print(f"{len(docs) - failed} passed, {failed} failed")
sys.exit(1 if failed or not docs else 0)
