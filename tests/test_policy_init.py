"""`dpsql policy init`: a draft policy from a real database's schema, with and without its
charged DP estimates, loaded and queried; the exact quantile sampler against its closed
form; the estimates' data access on neighbouring databases; PostgreSQL's catalog."""

from __future__ import annotations

import math
import random
import secrets
from collections import Counter
from fractions import Fraction
from pathlib import Path

import duckdb
import pandas
import pytest
import yaml

import dpsql
from dpsql.adapters import open_adapter
from dpsql.cli import main
from dpsql.draft import Suggestion, draft_policy
from dpsql.draft.bounds import COUNT_GRID, VALUE_QUANTILE, plan, value_grid
from dpsql.draft.guess import guess_tables
from dpsql.draft.queries import in_dialect
from dpsql.draft.schema import TableSchema, read_schema
from dpsql.ledger import open_ledger
from dpsql.mechanisms.quantiles import exponential_quantile, quantile_weights
from dpsql.mechanisms.samplers import secure_generator

CUSTOMERS = 300
REGIONS = ["north", "south", "east", "west"]


def make_sales(path: Path, without: int | None = None) -> Path:
    """A sales-like DuckDB database (customers, products, orders, order_items with foreign
    keys), the same at every call; `without` leaves out one customer with all their rows."""
    rng = random.Random(29)
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, name VARCHAR, "
        "email VARCHAR, region VARCHAR, birth_year INTEGER, vip BOOLEAN)"
    )
    con.execute(
        "CREATE TABLE products (product_id INTEGER PRIMARY KEY, name VARCHAR, "
        "category VARCHAR, price DECIMAL(10, 2))"
    )
    con.execute(
        "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER "
        "REFERENCES customers (customer_id), order_date DATE, channel VARCHAR, "
        "total DECIMAL(12, 2), notes VARCHAR)"
    )
    con.execute(
        "CREATE TABLE order_items (item_id INTEGER PRIMARY KEY, order_id INTEGER "
        "REFERENCES orders (order_id), product_id INTEGER REFERENCES products (product_id), "
        "quantity INTEGER, unit_price DOUBLE)"
    )
    customers, orders, items = [], [], []
    for c in range(1, CUSTOMERS + 1):
        customers.append((c, f"n{c}", f"c{c}@example.org", rng.choice(REGIONS),
                          rng.randint(1940, 2005), rng.random() < 0.1))  # fmt: skip
        for _ in range(rng.randint(1, 12)):  # a customer has 1 to 12 orders
            order = len(orders) + 1
            day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            orders.append((order, c, day, rng.choice(["web", "store"]),
                           round(rng.uniform(5, 900), 2), "ok"))  # fmt: skip
            for _ in range(rng.randint(1, 4)):
                items.append((len(items) + 1, order, rng.randint(1, 40), rng.randint(1, 10),
                              round(rng.uniform(1, 200), 2)))  # fmt: skip
    products = [(p, f"p{p}", rng.choice(["food", "tools"]), 9.99) for p in range(1, 41)]
    dropped = {o[0] for o in orders if o[1] == without}
    rows = {
        "customers": [c for c in customers if c[0] != without],
        "products": products,
        "orders": [o for o in orders if o[0] not in dropped],
        "order_items": [i for i in items if i[1] not in dropped],
    }
    for table, values in rows.items():
        con.register("frame", pandas.DataFrame(values))  # executemany goes row by row
        con.execute(f"INSERT INTO {table} SELECT * FROM frame")
        con.unregister("frame")
    con.close()
    return path


@pytest.fixture(scope="module")
def sales(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sales(tmp_path_factory.mktemp("sales") / "sales.duckdb")


def _init(*args: str) -> int:
    return main(["policy", "init", *args])


def test_the_draft_guesses_units_references_and_private_columns_and_loads(
    sales: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "policy.yaml"
    assert _init("--database", str(sales), "--public", "products", "-o", str(out)) == 0
    printed = capsys.readouterr().out
    assert "orders: max_rows_per_unit and max_groups_per_unit (now 1)" in printed
    text = out.read_text()
    tables = yaml.safe_load(text)["tables"]
    assert tables["customers"]["privacy_unit"] == "customer_id"
    assert tables["orders"]["privacy_unit"] == "customer_id"  # a foreign key to people
    assert tables["order_items"]["privacy_unit"] == {
        "via": "order_id", "references": "orders.order_id",
    }  # fmt: skip
    assert tables["products"] == {
        "public": True,
        "columns": {"product_id": {"type": "int"}, "name": {"type": "string"},
                    "category": {"type": "string"}, "price": {"type": "float"}},
    }  # fmt: skip
    customers = tables["customers"]["columns"]
    assert customers["name"] == customers["email"] == {"type": "string", "private": True}
    assert customers["region"] == {"type": "string"}  # no domain unless the owner asks
    assert customers["vip"] == {"type": "bool", "values": [False, True]}  # from the type
    assert tables["orders"]["columns"]["notes"]["private"]  # free text
    assert tables["orders"]["columns"]["order_id"]["private"]  # a key
    assert "private" not in tables["order_items"]["columns"]["product_id"]  # joins products
    assert "lower" not in tables["orders"]["columns"]["total"]
    # Nothing of the data is in the draft, and what is left open says so where it is.
    assert not any(region in text for region in REGIONS) and "@example.org" not in text
    assert "TODO: 1 and 1 keep ONE row" in text
    with dpsql.connect(str(sales), policy=str(out), seed=1) as con:
        cur = con.cursor()
        cur.execute("SELECT COUNT(*) FROM orders")
        assert isinstance(cur.fetchone()[0], int)
        cur.execute(
            "SELECT p.category, COUNT(*) FROM order_items i JOIN products p "
            "ON i.product_id = p.product_id GROUP BY p.category"
        )
        cur.fetchall()
        with pytest.raises(dpsql.ProgrammingError, match="lower"):
            cur.execute("SELECT SUM(total) FROM orders")


def test_suggested_bounds_are_charged_written_and_answer_a_sum(
    sales: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out, ledger = tmp_path / "policy.yaml", tmp_path / "budget.sqlite"
    args = ["--database", str(sales), "--public", "products", "--suggest-bounds", "2",
            "--owner-budget", "3", "--ledger", str(ledger), "-o", str(out)]  # fmt: skip
    assert _init(*args) == 0
    assert f"charged epsilon 2 to analyst owner (ledger {ledger})" in capsys.readouterr().out
    document = yaml.safe_load(out.read_text())
    assert document["ledger"] == str(ledger)
    assert document["analysts"]["owner"]["epsilon"] == 3.0
    orders = document["tables"]["orders"]
    # About 25 of 300 customers have one order: candidate 1 is some 260 ranks from the 95th
    # percentile, e^-23 as likely as the best at 2/11 per estimate, against a base measure
    # that favours it by e^2.2: below e^-19.
    assert orders["max_rows_per_unit"] > 1
    total = orders["columns"]["total"]
    assert total["lower"] < total["upper"]
    assert "DP estimate" in out.read_text()
    with open_ledger(ledger) as book:
        (charge,) = book.charges("owner")
    assert charge.cost.epsilon == 2 and "suggest-bounds" in charge.fingerprint
    with dpsql.connect(str(sales), policy=str(out), seed=1) as con:
        cur = con.cursor()
        cur.execute("SELECT COUNT(*), SUM(total) FROM orders")
        count, summed = cur.fetchone()
        assert isinstance(count, int) and summed is not None
    with dpsql.connect(str(sales), policy=str(out), analyst="owner") as con:
        assert con.budget().epsilon_spent == 2.0  # the draft's charge, on the draft's ledger
    # The owner's budget holds one more run of 1, not of 2.
    assert _init(*args[:-2], "-o", str(tmp_path / "again.yaml")) == 1
    assert "--owner-budget" in capsys.readouterr().err


def _steps_past_the_best(values: list[float], grid: tuple, chosen: float, q: Fraction) -> tuple:
    """How many more ranks than the grid's best candidates `chosen` is from q n, and how many
    grid steps above the smallest of them it lies."""

    def gap(candidate: float) -> float:
        return abs(sum(v <= candidate for v in values) - q * len(values))

    best = min(gap(c) for c in grid)
    first = min(i for i, c in enumerate(grid) if gap(c) == best)
    return gap(chosen) - best, grid.index(chosen) - first


def test_estimates_at_a_large_epsilon_land_on_the_closed_forms_best_candidates(
    sales: Path, tmp_path: Path
) -> None:
    """With 40 per estimate (11 estimates), a candidate d ranks worse than the best is e^-20d
    as likely (the base measure moves it by e^(steps/5)): 3 ranks off is below 1e-20 in all.
    Past the largest value every candidate is as good, and the base measure makes each step
    up e^-1/5 as likely: 50 steps (5 decades) up has probability e^-10."""
    suggestion = Suggestion(440, budget=500, ledger=str(tmp_path / "l.sqlite"), seed=3)
    draft = draft_policy(str(sales), public=["products"], suggestion=suggestion)
    orders = draft.document["tables"]["orders"]
    con = duckdb.connect(str(sales), read_only=True)
    rows = con.execute("SELECT COUNT(*), MAX(total) FROM orders GROUP BY customer_id").fetchall()
    per_unit, largest = [n for n, _ in rows], [float(m) for _, m in rows]
    chosen = orders["max_rows_per_unit"]
    ranks, steps = _steps_past_the_best(per_unit, COUNT_GRID, chosen, Fraction(95, 100))
    assert ranks <= 2 and steps <= 50
    upper = orders["columns"]["total"]["upper"]
    ranks, steps = _steps_past_the_best(largest, value_grid("float"), upper, VALUE_QUANTILE)
    assert ranks <= 2 and steps <= 50


def test_each_estimate_reads_one_value_per_unit_so_a_neighbour_moves_one_count(
    tmp_path: Path,
) -> None:
    """The histograms of two databases that differ by one customer, with all their
    orders and items, differ by at most 1 (L1): the sensitivity the quantile assumes."""
    both = [make_sales(tmp_path / "d.duckdb"), make_sales(tmp_path / "n.duckdb", without=7)]
    histograms = []
    for path in both:
        adapter = open_adapter(str(path))
        drafts = guess_tables(read_schema(adapter), adapter.dialect, ["products"])
        estimates = plan(drafts)
        histograms.append(
            [Counter(dict(adapter.execute(in_dialect(e.sql, "duckdb"))[1])) for e in estimates]
        )
        adapter.close()
    # rows and groups per unit of orders, rows of order_items (it has no group key), and
    # lower and upper of birth_year, total, quantity and unit_price
    assert len(histograms[0]) == 3 + 2 * 4
    for one, other in zip(*histograms, strict=True):
        difference = sum(abs(one[b] - other[b]) for b in one.keys() | other.keys())
        assert difference <= 1


def test_the_quantile_sampler_draws_the_exponential_mechanisms_distribution() -> None:
    counts, q, epsilon = [3, 5, 2, 0, 4], Fraction(1, 2), Fraction(1)
    prior = [Fraction(k, 5) for k in range(5)]
    exponents = quantile_weights(counts, q, epsilon, prior)
    weights = [math.exp(-x) for x in exponents]
    expected = [w / sum(weights) for w in weights]
    rng = secure_generator(11)
    draws = 2000
    seen = Counter(exponential_quantile(counts, q, epsilon, rng, prior) for _ in range(draws))
    for index, p in enumerate(expected):
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(seen[index] - draws * p) <= 5 * sigma
    # The privacy map: a neighbour (one value more, in any bucket) moves no log-probability
    # by more than epsilon.
    for bucket in range(len(counts)):
        neighbour = list(counts)
        neighbour[bucket] += 1
        other = [math.exp(-x) for x in quantile_weights(neighbour, q, epsilon, prior)]
        ratios = [math.log(a / sum(weights)) - math.log(b / sum(other))
                  for a, b in zip(weights, other, strict=True)]  # fmt: skip
        assert max(abs(r) for r in ratios) <= float(epsilon) + 1e-12


def test_refusals_say_what_to_write_instead(
    sales: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "p.yaml"
    out.write_text("keep me")
    with pytest.raises(SystemExit, match="--force"):
        _init("--database", str(sales), "-o", str(out))
    assert out.read_text() == "keep me"
    assert _init("--database", str(sales), "--public", "nations", "-o", str(tmp_path / "q")) == 1
    assert "name a drafted table" in " ".join(capsys.readouterr().err.split())
    assert _init("--database", str(sales), "--table", "nope", "-o", str(tmp_path / "r")) == 1
    said = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "its tables: customers, order_items, orders, products" in said
    assert not (tmp_path / "q").exists() and not (tmp_path / "r").exists()
    # By default the owner's budget is one run's: a second would draw fresh noise to average.
    once = ["--database", str(sales), "--suggest-bounds", "0.5", "--ledger", str(tmp_path / "l")]
    assert _init(*once, "-o", str(tmp_path / "a.yaml")) == 0
    assert _init(*once, "-o", str(tmp_path / "b.yaml")) == 1
    assert "--owner-budget" in capsys.readouterr().err and not (tmp_path / "b.yaml").exists()
    with pytest.raises(dpsql.InterfaceError, match="--ledger"):
        draft_policy("postgresql://nobody@127.0.0.1:1/none", suggestion=Suggestion(1.0))
    with pytest.raises(dpsql.InterfaceError, match="forgets its charges"):
        draft_policy(str(sales), suggestion=Suggestion(1.0, ledger=":memory:"))


def test_version_and_budget_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"dpsql {dpsql.__version__}"
    with pytest.raises(SystemExit):
        main(["budget", "--help"])
    assert "whose budget to show" in capsys.readouterr().out


def test_postgres_foreign_keys_from_the_catalog(postgres_url: str, tmp_path: Path) -> None:
    import psycopg

    schema = f"policy_init_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(postgres_url, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is unreachable: {exc}")
    with admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            admin.execute(f"CREATE TABLE {schema}.users (user_id int PRIMARY KEY, email text)")
            admin.execute(
                f"CREATE TABLE {schema}.orders (order_id int PRIMARY KEY, user_id int "
                f"REFERENCES {schema}.users (user_id), amount numeric(10, 2))"
            )
            admin.execute(
                f"CREATE TABLE {schema}.lines (line_id int PRIMARY KEY, order_id int "
                f"REFERENCES {schema}.orders (order_id), quantity int, note text)"
            )
            admin.execute(
                f"INSERT INTO {schema}.users SELECT g, 'u' || g FROM generate_series(1, 20) g"
            )
            admin.execute(
                f"INSERT INTO {schema}.orders SELECT g, 1 + g % 20, g FROM generate_series(1, 60) g"
            )
            admin.execute(
                f"INSERT INTO {schema}.lines SELECT g, 1 + g % 60, 2, 'x' "
                "FROM generate_series(1, 90) g"
            )
            names = [f"{schema}.{t}" for t in ("users", "orders", "lines")]
            ledger = str(tmp_path / "l.sqlite")
            suggestion = Suggestion(1.0, ledger=ledger, seed=4)  # its SQL, in PostgreSQL's dialect
            draft = draft_policy(postgres_url, tables=names, suggestion=suggestion)
            tables = draft.document["tables"]
            assert tables[f"{schema}.users"]["privacy_unit"] == "user_id"
            assert tables[f"{schema}.orders"]["privacy_unit"] == "user_id"
            assert tables[f"{schema}.lines"]["privacy_unit"] == {
                "via": "order_id", "references": f"{schema}.orders.order_id",
            }  # fmt: skip
            assert tables[f"{schema}.lines"]["columns"]["note"]["private"]
            amount = tables[f"{schema}.orders"]["columns"]["amount"]
            assert amount["type"] == "float" and amount["lower"] <= amount["upper"]
            assert draft.document["ledger"] == ledger
            # The same schema through SQLAlchemy, which asks the catalog the same way.
            alchemy = postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)
            for url in (postgres_url, alchemy):
                adapter = open_adapter(url)
                try:
                    assert set(names) <= set(adapter.table_names())
                    assert adapter.foreign_keys(names[2]) == {"order_id": (names[1], "order_id")}
                finally:
                    adapter.close()
            again = draft_policy(alchemy, tables=names).document["tables"]
            assert {k: t.get("privacy_unit") for k, t in again.items()} == {
                k: t.get("privacy_unit") for k, t in tables.items()
            }
            with dpsql.connect(postgres_url, policy=draft.document, analyst="owner") as con:
                assert con.budget().epsilon_spent == 1.0  # all of the owner's budget
            with dpsql.connect(postgres_url, policy=draft.document, seed=2) as con:
                cur = con.cursor()
                cur.execute(f"SELECT COUNT(*) FROM {schema}.lines")
                assert isinstance(cur.fetchone()[0], int)
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def test_sqlite_keys_and_references_through_sqlalchemy(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "clinic.db"
    with sqlite3.connect(path) as con:
        con.executescript(
            "CREATE TABLE patients (patient_id INTEGER PRIMARY KEY, full_name TEXT);"
            "CREATE TABLE visits (visit_id INTEGER PRIMARY KEY, patient_id INTEGER "
            "REFERENCES patients (patient_id), cost REAL, notes TEXT);"
            "CREATE TABLE doses (dose_id INTEGER PRIMARY KEY, visit_id INTEGER "
            "REFERENCES visits (visit_id), amount NUMERIC);"
            "INSERT INTO patients VALUES (1, 'a'), (2, 'b');"
            "INSERT INTO visits VALUES (1, 1, 10.5, 'x'), (2, 1, 20, 'y'), (3, 2, 5, 'z');"
            "INSERT INTO doses VALUES (1, 1, 2), (2, 3, 1);"
        )
    url = f"sqlite:///{path}"
    draft = draft_policy(url)
    tables = draft.document["tables"]
    assert tables["patients"]["privacy_unit"] == "patient_id"
    assert tables["visits"]["privacy_unit"] == "patient_id"
    assert tables["doses"]["privacy_unit"] == {"via": "visit_id", "references": "visits.visit_id"}
    assert tables["visits"]["columns"]["notes"]["private"]
    with dpsql.connect(url, policy=draft.document, ledger=str(tmp_path / "l.sqlite")) as con:
        cur = con.cursor()
        cur.execute("SELECT COUNT(*) FROM doses")
        assert isinstance(cur.fetchone()[0], int)


def test_what_no_policy_type_fits_is_left_out_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "odd.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE blobs (u UUID, l INTEGER[])")
        con.execute("CREATE TABLE users (user_id INTEGER PRIMARY KEY, tag UUID)")
    draft = draft_policy(str(path))
    assert list(draft.document["tables"]) == ["users"]
    assert list(draft.document["tables"]["users"]["columns"]) == ["user_id"]
    assert "left out: tag (UUID)" in draft.text and "Left out: blobs" in draft.text
    assert draft.left_open[0] == "blobs: left out (no column a policy type fits)"
    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE users")
    with pytest.raises(dpsql.ProgrammingError, match="declare views that cast them"):
        draft_policy(str(path))


def test_one_kind_of_unit_when_people_tables_reference_each_other() -> None:
    """Accounts of customers are the customers': their key is no unit of its own, and a
    transfer is the customer's whose account it references."""
    schemas = [
        TableSchema("customers", {"customer_id": "INTEGER"}, frozenset({"customer_id"})),
        TableSchema("accounts", {"account_id": "INTEGER", "customer_id": "INTEGER"},
                    frozenset({"account_id"}), {"customer_id": ("customers", "customer_id")}),
        TableSchema("transfers", {"transfer_id": "INTEGER", "account_id": "INTEGER",
                                  "paid": "BOOLEAN", "amount": "DOUBLE"},
                    frozenset({"transfer_id"}), {"account_id": ("accounts", "account_id")}),
        TableSchema("employees", {"employee_id": "INTEGER", "manager_id": "INTEGER"},
                    frozenset({"employee_id"}), {"manager_id": ("employees", "employee_id")}),
    ]  # fmt: skip
    drafts = {d.name: d for d in guess_tables(schemas, "duckdb")}
    assert drafts["customers"].unit == "customer_id" and drafts["customers"].unique_unit
    assert drafts["accounts"].unit == "customer_id" and not drafts["accounts"].unique_unit
    assert drafts["transfers"].via == ("account_id", "accounts", "account_id")
    assert drafts["employees"].unit == "employee_id"  # a reference to itself
    census = TableSchema("census", {"pid": "INTEGER", "age": "INTEGER"}, frozenset({"pid"}))
    (draft,) = guess_tables([census], "duckdb")
    assert draft.unit == "pid" and draft.unique_unit  # a unique person id: one row each
    assert drafts["transfers"].columns["paid"].spec == {"type": "bool", "values": [False, True]}
