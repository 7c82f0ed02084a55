"""Planning: placements and layouts (``layout``), the typed steps (``steps``), the planner that
gives each rank its steps (``planner``), box exchanges on meshes (``mesh_plan``, per rank:
``box_geometry``), the two-level cost model (``host_costs``) and the whole-world report of a
change (``plan``). Pure: no engine, no array library beyond numpy's vectorised geometry."""
