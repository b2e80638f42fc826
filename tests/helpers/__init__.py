"""What tests share: fakes of the engine, in-process and real-process servers, scripted
agents, hook modules named by dotted path, and the paths to ``../shared`` fixtures."""
