"""The stage recipes (TOML), one per stage and setting. This folder ships in the package as
``reasonrl.recipes``, so `reasonrl main-job` finds its *-cpu.toml recipes in any install."""
