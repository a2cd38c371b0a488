# Turns a file into a C array initializer (comma-separated bytes) for #include: the live page
# is compiled into the binaries, so nothing is read from disk at run time.
# Usage: cmake -DIN=file -DOUT=file.inc -P embed_file.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}.tmp" "${body}\n")
file(RENAME "${OUT}.tmp" "${OUT}")
