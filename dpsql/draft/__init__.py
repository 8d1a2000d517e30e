"""`dpsql policy init`: draft a privacy policy from a database's schema (this package's job).

The modules, in the order a draft is made:

- schema.py   what the database says: tables, column types, keys, foreign keys (through
              the adapters; no row is read)
- guess.py    the guesses: privacy units from keys and names, references (`via:`),
              identifiers and free text marked private, each with the reason it was made
- domains.py  public key domains read from the data, only when the owner asks
- bounds.py   `--suggest-bounds`: DP estimates of numeric ranges and of rows and groups
              per unit, charged to the ledger through a Session before any is run
- render.py   the YAML text, with comments that say what each choice means
- draft.py    the whole path: `draft_policy`

It sits beside the Session (which it opens to charge the estimates to the owner's
budget) and reads the schema through the adapters; only `dpsql policy` imports it.
"""

from dpsql.draft.draft import Draft, Suggestion, draft_policy

__all__ = ["Draft", "Suggestion", "draft_policy"]
