"""Lab graders: ``minipar check NN`` (see grader.py); one ``labNN.py`` spec per lab."""
