"""fairpool_cli: the `fairpool` command and the programs around it.

`main` (the command line), `local` (`fairpool up`: the manifests as local processes, and the
live `fairpool demo`), `load` (`fairpool load`: multi-tenant load against an OpenAI-compatible
endpoint), `plan_report` (`fairpool plan`'s tables), `parent` (children that die with
`fairpool up`). A program, not a library: it imports the core library and the components;
none of them imports it.
"""
