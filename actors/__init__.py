"""The only package that imports ray: client actors, RayFederation, the coordinator actor, the driver."""
