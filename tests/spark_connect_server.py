"""A Spark Connect server for test_spark_connect.py, which starts it in a process of its
own: `python spark_connect_server.py PORT` serves local[2] on 127.0.0.1:PORT, prints
"ready" once it listens, and stops when its standard input closes."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main() -> None:
    port = sys.argv[1]
    spark = (
        SparkSession.builder.master("local[2]").appName("dpsql-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", port)
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.log.level", "ERROR")
        .getOrCreate()
    )  # fmt: skip
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes it
    spark.stop()


if __name__ == "__main__":
    main()
