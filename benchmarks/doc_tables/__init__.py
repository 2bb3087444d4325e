"""The renderers of the tables README.md and docs/ show, one module per kind of recorded result
(``benchmarks/tables.py`` keeps the Markdown blocks they fill). Only the standard library is used."""
