"""The paper's method as tensor math, with no files and no models: affinities and Universal
Task Descriptors (`descriptor`) and the closed-form two-filter ridge solve (`ridge`)."""
