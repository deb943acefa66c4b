# cmake -P script for tests that check a command's exit code and its output together:
#   cmake -DCMD=<program|arg|...> -DEXIT=<code> -DREGEX=<regex> -P expect_exit.cmake
# CMD separates the arguments with '|'. Passes when the exit code is EXIT and stdout + stderr
# match REGEX; prints the output either way.
string(REPLACE "|" ";" command "${CMD}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL EXIT)
  message(FATAL_ERROR "exit code '${rc}', expected ${EXIT}")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "the output does not match '${REGEX}'")
endif()
