"""Megatron-DeepSpeed's two names for a GPT parameter: GPTModelPipe (ZeRO 0-2) and GPTModel (ZeRO-3)."""
import re


def pipe_name(name, layers):
    """The GPTModelPipe name of a parameter named either way (a pipe name is returned as it is)."""
    for plain, pipe in (("language_model.embedding.", "tied_modules.embed."),
                        ("language_model.encoder.final_layernorm.", f"{layers + 2}.")):
        if name.startswith(plain):
            return pipe + name[len(plain):]
    m = re.match(r"language_model\.encoder\.layers\.(\d+)\.(.*)", name)
    return f"{int(m[1]) + 2}.{m[2]}" if m else name
