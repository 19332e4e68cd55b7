"""The control plane's wire schemas: every JSON body any role sends or answers, one module per
part of the conversation.

- `base`: the API's prefix, the bounded scalar types, `Request`/`Response`, the roles' and
  tasks' states, `ErrorBody`
- `membership`: registering and heartbeats (worker -> coordinator)
- `group`: the data-parallel learner group (learner <-> coordinator)
- `tasks`: tasks (coordinator -> worker, `POST /task`) and how a worker says one ended
- `experience`: chunk reports and collect permits (collector -> coordinator)
- `sampling`: sample requests, their answers, and learners' reports (learner <-> coordinator)
- `evaluation`: evaluation reports and the results kept of them (collector -> coordinator)
- `control`: the run's scale and state (operator -> coordinator)
- `views`: read-only views of workers, tasks, buffers and evaluations (coordinator GET routes)
- `status`: `GET /status`, the whole run at one glance, and `GET /league`
- `records`: the run's log records as a feed (`GET /records`)

Requests forbid unknown fields, so a misspelt field is a 400 that names it rather than a
silently ignored value. Payload data never appears here: chunks travel through storage and
only their metadata (`experience.ChunkMeta`) crosses HTTP. Component names in the OpenAPI
document are the class names, so a name is never used twice across these modules.
"""
