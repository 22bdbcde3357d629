"""Joins kiln-features outputs (PREFIX.index, .tokens, .features) into one, in the order given, so
that data captured in parts (while generation still runs) or from several prompt sources trains
as one set. train_medusa.py holds out the last 10% of the joined samples: put the source the tree
should be chosen on last.

  python3 tools/train/concat_data.py OUT_PREFIX PREFIX [PREFIX ...]
"""
import sys


def main():
    out, parts = sys.argv[1], sys.argv[2:]
    if not parts:
        sys.exit(__doc__)
    with open(out + ".index", "w") as index, open(out + ".tokens", "wb") as tokens, \
            open(out + ".features", "wb") as features:
        for p in parts:
            index.write(open(p + ".index").read())
            for suffix, f in ((".tokens", tokens), (".features", features)):
                with open(p + suffix, "rb") as src:
                    while chunk := src.read(1 << 24):
                        f.write(chunk)


if __name__ == "__main__":
    main()
