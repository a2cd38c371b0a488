# ddp_set_warnings(target): the warning set every target of ours compiles with; DDP_WERROR
# (on in CI) makes them errors. Third-party headers come from /usr/include and stay quiet.
function(ddp_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DDP_WERROR}>>:-Werror>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${DDP_WERROR}>>:-Xcompiler=-Wall,-Werror>)
endfunction()
