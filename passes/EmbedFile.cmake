# Writes IN as a C++ raw string literal into OUT (used for the registry).
file(READ ${IN} content)
file(WRITE ${OUT} "R\"adaptjson(${content})adaptjson\"\n")
