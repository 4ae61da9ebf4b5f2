"""What every refusal test checks of a finished command: the exit code, the words the message must
hold, and that it did not crash."""


def refusal_problems(p, must_contain, code=1):
    """Problems with a subprocess.CompletedProcess (text mode) that should have refused."""
    text = p.stdout + p.stderr
    problems = [] if p.returncode == code else [f"exit {p.returncode}, expected {code}"]
    problems += [f"message lacks '{s}'" for s in must_contain if s not in text]
    if any(crash in text for crash in ("Traceback", "terminate called", "Segmentation")):
        problems.append("crashed")
    return problems
