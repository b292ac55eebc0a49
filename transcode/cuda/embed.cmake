# Turns the kernels' fatbin into a C file (cmake -P): the bytes as a
# const array, 16-byte aligned because the driver reads the fatbin header
# in place.  Variables: BIN2C, INPUT, OUTPUT, NAME.
execute_process(COMMAND ${BIN2C} -c -n ${NAME} ${INPUT}
  OUTPUT_VARIABLE text RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bin2c failed on ${INPUT}")
endif()
set(decl "const unsigned char ${NAME}[] = {")
string(FIND "${text}" "${decl}" at)
if(at LESS 0)
  message(FATAL_ERROR "bin2c output not recognised")
endif()
string(REPLACE "${decl}"
  "#include <stddef.h>\n_Alignas(16) ${decl}" text "${text}")
file(SIZE ${INPUT} size)
file(WRITE ${OUTPUT}
  "/* Generated from ${INPUT} by embed.cmake: do not edit. */\n"
  "${text}\nconst size_t ${NAME}_size = ${size};\n")
