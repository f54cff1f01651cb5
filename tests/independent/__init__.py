"""A second, independent exact implementation of fp4ref's numerics rules, written from
/work/shared/SPEC.md alone (see README.md). Pure Python integers: a finite value is
(-1)**neg * m * 2**e with int m >= 0; nothing here imports reference/, fp4ref/ or probes/."""
