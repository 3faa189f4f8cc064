"""The `switchboard` command: the application shell above both services.

It runs them (`serve`), operates on their databases (`db`, `session rebuild`) and
talks to running services as a client does (the operator commands, `agent`, `chat`,
`gateway`, `console`). Neither service imports it.
"""
