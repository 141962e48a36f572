"""What a person sees of a circuit: the two commands and their output.

cli.py     probmoe-compile, probmoe-inspect (argument parsing, one-line errors)
report.py  the facts probmoe-compile prints (dict and text)
text.py    the per-level table, the node listing, DOT
draw.py    pictures with matplotlib (imported only when drawing)
"""
