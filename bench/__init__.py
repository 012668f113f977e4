"""The django_hopper benchmark (issue 8): ``python -m bench.run`` or ``make bench``.

Every hopper figure is measured beside a raw-SQL bound taken in the same run,
because this machine is shared and noisy: the ratio is the result, the absolute
figure is for scale. See docs/benchmark.md.
"""
