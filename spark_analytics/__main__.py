"""`python -m spark_analytics --traces DIR ...`: the audit without the `aldebaran` command."""

from spark_analytics.job import main

raise SystemExit(main())
