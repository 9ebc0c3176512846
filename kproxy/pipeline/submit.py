"""The file to hand to ``spark-submit``: the same job as ``kproxy analyze``.

    spark-submit --master spark://HOST:7077 "$(python -m kproxy.pipeline.submit --path)" \\
        /data/capture --out /data/analysis

Master, memory and every other Spark setting come from spark-submit; this
entry sets none. Only the driver runs kproxy's Python (the job uses Spark SQL
functions, no Python UDFs), so executors need no kproxy install.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:] == ["--path"]:
        print(__file__)
        sys.exit(0)
    from kproxy.pipeline.cli import main
    sys.exit(main(sys.argv[1:], default_master=None))
